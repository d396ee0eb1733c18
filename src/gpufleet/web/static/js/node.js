// Node page: state, operator actions, active findings (acknowledge), per-GPU charts over
// time, GPU table with device info, lifecycle history and validation results.
import * as api from "./api.js";
import { $, html, raw, setHtml, words, sentence, num, bytes, ts, ago, stateBadge, healthBadge, nodeHealthBadge, isStale, sevBadge } from "./util.js";
import { lineChart, gpuColor } from "./chart.js";
import { confirmAction } from "./dialog.js";

// Which actions the lifecycle allows from each state (mirrors ALLOWED and ACTION_TARGET in
// gpufleet/control/lifecycle.py and actions.py; the server stays the authority: 409 otherwise).
const TARGET = { drain: "draining", resume: "in_service", repair: "repair", validate: "validating", fail: "failed" };
const ALLOWED = {
  registering: ["validating", "lost", "failed"],
  validating: ["in_service", "repair", "draining", "lost", "failed"],
  in_service: ["draining", "lost", "failed"],
  draining: ["drained", "in_service", "repair", "lost", "failed"],
  drained: ["in_service", "repair", "lost", "failed"],
  repair: ["validating", "failed"],
  lost: ["validating", "draining", "drained", "repair", "failed"],
  failed: ["repair"],
};
const ACTIONS = [
  { a: "cordon", label: "Cordon", help: "No new work on this node; running work continues." },
  { a: "uncordon", label: "Uncordon", help: "Allow new work again." },
  { a: "drain", label: "Drain", help: "Cordon and let running work finish (draining -> drained).", danger: true },
  { a: "resume", label: "Resume", help: "Back to in_service." },
  { a: "repair", label: "Send to repair", help: "Take the node out for repair.", danger: true },
  { a: "validate", label: "Validate", help: "Move to validating; a validation result decides." },
  { a: "fail", label: "Mark failed", help: "Mark the node failed (dead hardware).", danger: true },
  { a: "acknowledge", label: "Ack all findings", help: "Acknowledge every active finding of this node." },
];
const CHARTS = [
  { f: "gpu_util_pct", title: "GPU utilization", unit: "%", yMax: 100 },
  { f: "power_w", title: "Power vs limit", unit: "W" },
  { f: "gpu_temp_c", title: "GPU temperature", unit: "°C" },
  { f: "sm_clock_mhz", title: "SM clock", unit: "MHz" },
];

const STALE_S = 10; // seconds behind the node's newest sample (agents sample every 1-2 s)

let state = { focus: null, resolution: "raw", detail: null, series: [] };

function allowed(node, a) {
  if (a === "cordon") return !node.cordoned;
  if (a === "uncordon") return node.cordoned;
  if (a === "acknowledge") return node.findings_active > 0;
  return (ALLOWED[node.state] || []).includes(TARGET[a]);
}

function actionsHtml(ctx, node) {
  if (!ctx.canOperate) return html``;
  return html`<div class="actions" id="node-actions">${ACTIONS.map((x) => html`
    <button class="btn ${x.danger ? "danger" : ""}" data-action="${x.a}" title="${x.help}" ${allowed(node, x.a) ? "" : "disabled"}>${x.label}</button>`)}</div>`;
}

function findingsHtml(ctx, list, now) {
  if (!list.length) return html`<p class="muted">No active findings.</p>`;
  return html`<table class="grid" id="node-findings"><thead><tr><th>sev</th><th>code</th><th>GPU</th><th>message</th><th>recommended action</th><th>first seen</th><th>last seen</th><th>ack</th></tr></thead><tbody>
  ${list.map((f) => html`<tr data-finding="${f.id}" class="row-h${Math.min(f.severity, 2)}">
    <td>${sevBadge(f.severity)}</td><td class="mono">${f.code}</td><td class="num">${f.gpu_index ?? "—"}</td>
    <td>${f.message}</td><td><b>${sentence(f.action)}</b></td>
    <td class="nowrap" title="${ts(f.first_seen_s)}">${ago(f.first_seen_s, now)}</td><td class="nowrap" title="${ts(f.last_seen_s)}">${ago(f.last_seen_s, now)}</td>
    <td>${f.acknowledged_by ? html`<span class="muted" title="${ts(f.acknowledged_s)}">✓ ${f.acknowledged_by}</span>`
      : ctx.canOperate ? html`<button class="btn small" data-ack="${f.id}">Acknowledge</button>` : html`<span class="muted">—</span>`}</td></tr>`)}
  </tbody></table>`;
}

function gpuTableHtml(detail, now) {
  const info = new Map(detail.devices.map((d) => [d.index, d.info]));
  // a lost node's samples are history: every row is stale, aged against now
  const lost = isStale(detail.node);
  const newest = lost ? (now ?? Date.now() / 1000) : Math.max(...detail.node.gpu_latest.map((g) => g.t ?? 0));
  return html`<table class="grid" id="gpu-table"><thead><tr><th>GPU</th><th>health</th><th class="num">util</th><th class="num">power / limit</th><th class="num">temp</th><th class="num">SM clock</th><th class="num">mem used</th><th class="num">ECC DBE</th><th>PCIe</th><th>PCI bus</th><th>UUID</th><th>serial</th></tr></thead><tbody>
  ${detail.node.gpu_latest.map((g) => {
    const m = g.metrics || {};
    const d = info.get(g.index) || {};
    const down = d.pcie_gen_current < d.pcie_gen_max || d.pcie_width_current < d.pcie_width_max;
    const hot = m.gpu_temp_c !== null && d.slowdown_temp_c && m.gpu_temp_c >= d.slowdown_temp_c - 5;
    // a GPU whose newest sample is well behind its node's newest is not answering (lost GPU)
    const stale = (lost && g.t !== null) || (g.t !== null && newest - g.t > STALE_S);
    return html`<tr class="row-h${Math.min(g.health, 2)} ${stale ? "stale" : ""}" data-gpu="${g.index}">
      <td><span class="swatch" style="background:${gpuColor(g.index)}"></span>${g.index}</td><td>${healthBadge(g.health)}${stale ? html` <span class="badge stale-b" title="newest sample ${ts(g.t)}: its figures are not current">no data ${ago(g.t, newest).replace(/ ago$/, "")}</span>` : ""}</td>
      <td class="num">${num(m.gpu_util_pct)} %</td>
      <td class="num">${num(m.power_w)} / ${num(g.power_limit_w)} W</td>
      <td class="num ${hot ? "bad" : ""}">${num(m.gpu_temp_c)} °C</td>
      <td class="num">${num(m.sm_clock_mhz)} MHz</td>
      <td class="num">${bytes(m.mem_used_bytes)} / ${bytes(d.memory_total_bytes)}</td>
      <td class="num ${m.ecc_dbe_volatile > 0 ? "bad" : ""}">${num(m.ecc_dbe_volatile)}</td>
      <td class="${down ? "bad" : ""}">${d.pcie_gen_current !== undefined ? `gen${d.pcie_gen_current} x${d.pcie_width_current}` : "N/A"}${down ? ` (max gen${d.pcie_gen_max} x${d.pcie_width_max})` : ""}</td>
      <td class="mono">${d.pci_bus_id ?? "N/A"}</td><td class="mono small">${g.uuid}</td><td class="mono">${d.serial ?? "N/A"}</td></tr>`;
  })}</tbody></table>`;
}

function deviceHtml(detail) {
  const d = (detail.devices[0] && detail.devices[0].info) || null;
  if (!d) return html`<p class="muted">No device info reported yet.</p>`;
  const rows = [
    ["GPU", d.name], ["model", d.model], ["driver", d.driver_version], ["CUDA driver", d.cuda_driver_version],
    ["NVML", d.nvml_version], ["VBIOS", d.vbios_version], ["InfoROM", d.inforom_version],
    ["memory", bytes(d.memory_total_bytes)], ["power limit", `${num(d.power_limit_enforced_w)} W (default ${num(d.power_limit_default_w)}, ${num(d.power_limit_min_w)}-${num(d.power_limit_max_w)})`],
    ["max SM / mem clock", `${d.max_sm_clock_mhz ?? "N/A"} / ${d.max_mem_clock_mhz ?? "N/A"} MHz`],
    ["slowdown / shutdown", `${d.slowdown_temp_c ?? "N/A"} / ${d.shutdown_temp_c ?? "N/A"} °C`],
    ["persistence", String(d.persistence_mode)], ["ECC", `${d.ecc_current}${d.ecc_pending !== d.ecc_current ? ` (pending ${d.ecc_pending})` : ""}`],
    ["MIG", String(d.mig_current)], ["compute mode", d.compute_mode],
  ];
  return html`<dl class="kvlist">${rows.map(([k, v]) => html`<dt>${k}</dt><dd>${v ?? "N/A"}</dd>`)}</dl>`;
}

function historyHtml(detail) {
  if (!detail.transitions.length) return html`<p class="muted">No transitions.</p>`;
  return html`<table class="grid" id="node-history"><thead><tr><th>when</th><th>from</th><th>to</th><th>who</th><th>why</th></tr></thead><tbody>
  ${detail.transitions.map((t) => html`<tr><td class="nowrap mono">${ts(t.at_s)}</td><td>${t.from_state ? stateBadge(t.from_state) : "—"}</td><td>${stateBadge(t.to_state)}</td><td class="mono">${t.actor}</td><td>${t.reason}</td></tr>`)}
  </tbody></table>
  ${detail.validations.length ? html`<h3>Validation results</h3><table class="grid"><thead><tr><th>when</th><th>verdict</th><th>by</th></tr></thead><tbody>${detail.validations.map((v) => html`<tr><td class="mono">${ts(v.received_s)}</td><td><span class="badge v-${v.verdict}">${v.verdict}</span></td><td class="mono">${v.actor}</td></tr>`)}</tbody></table>` : ""}`;
}

async function loadSeries(name, gpus) {
  const fields = CHARTS.map((c) => c.f);
  return Promise.all(gpus.map((g) => api.get(`/nodes/${encodeURIComponent(name)}/gpus/${g.index}/series`, { fields, resolution: state.resolution })
    .catch(() => ({ gpu: g.index, t: [], fields: {}, power_limit_w: g.power_limit_w }))));
}

function drawCharts(el) {
  const host = $("#charts", el);
  if (!host || !state.detail) return;
  const info = (state.detail.devices[0] && state.detail.devices[0].info) || {};
  const width = Math.floor((host.clientWidth - 12) / 2) || 460;
  const limits = [...new Set(state.series.map((s) => s.power_limit_w).filter((x) => x))];
  const refs = {
    power_w: limits.map((l) => ({ value: l, label: `limit ${l} W` })),
    gpu_temp_c: info.slowdown_temp_c ? [{ value: info.slowdown_temp_c, label: `slowdown ${info.slowdown_temp_c} °C` }] : [],
    sm_clock_mhz: info.max_sm_clock_mhz ? [{ value: info.max_sm_clock_mhz, label: `max ${info.max_sm_clock_mhz} MHz`, color: "#8b96a3" }] : [],
  };
  host.innerHTML = CHARTS.map((c) => `<div class="chartbox" data-chart="${c.f}">${lineChart({
    title: c.title, unit: c.unit, yMax: c.yMax ?? null, width, refs: refs[c.f] || [], focus: state.focus,
    series: state.series.map((s) => ({ gpu: s.gpu, t: s.t, v: s.fields[c.f] || [] })),
  })}</div>`).join("");
}

function legendHtml(gpus) {
  return html`<span class="muted">GPUs:</span> ${gpus.map((g) => html`<button class="chip ${state.focus === g.index ? "on" : ""}" data-focus="${g.index}"><span class="swatch" style="background:${gpuColor(g.index)}"></span>${g.index}</button>`)}
  <span class="sep"></span><span class="muted">window:</span>
  <button class="chip ${state.resolution === "raw" ? "on" : ""}" data-res="raw" title="recent samples from memory">recent (raw)</button>
  <button class="chip ${state.resolution === "minute" ? "on" : ""}" data-res="minute" title="per-minute means, 7 days">minutes (7 d)</button>`;
}

async function load(el, ctx, name, full) {
  const detail = await api.get(`/nodes/${encodeURIComponent(name)}`);
  state.detail = detail;
  const n = detail.node;
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  setHtml($("#node-head", el), html`
    <div class="title"><h1>${n.name}</h1> ${stateBadge(n.state)} ${nodeHealthBadge(n, now)} ${n.cordoned ? html`<span class="badge cordon">cordoned</span>` : ""}</div>
    <div class="facts"><span>rack <b>${n.rack ?? "—"}</b></span><span>model <b>${n.model ?? "—"}</b></span><span>GPUs <b>${n.gpus}</b></span>
    ${n.tenant ? html`<span>tenant <b>${n.tenant}</b></span>` : ""}<span>last seen <b title="${ts(n.last_seen_s)}">${ago(n.last_seen_s, now)}</b></span>
    <span>${words(n.state)} since <b title="${ts(n.state_since_s)}">${ago(n.state_since_s, now)}</b></span></div>
    <div class="reason-line">${n.reason || n.state_reason}</div>${actionsHtml(ctx, n)}`);
  wireActions(el, ctx, n.name);
  setHtml($("#findings", el), findingsHtml(ctx, detail.findings, now));
  wireAcks(el, ctx, n.name);
  setHtml($("#gpus", el), gpuTableHtml(detail, now));
  if (full) {
    setHtml($("#device", el), deviceHtml(detail));
  }
  setHtml($("#history", el), historyHtml(detail));
  setHtml($("#chart-legend", el), legendHtml(n.gpu_latest));
  wireLegend(el, ctx, n.name);
  state.series = await loadSeries(n.name, n.gpu_latest);
  drawCharts(el);
  // replicas: recent samples another replica holds but could not give (series_forward)
  const partial = state.series.find((s) => s.partial);
  setHtml($("#chart-note", el), partial ? html`<p class="muted" role="status">Partial: ${partial.note}</p>` : html``);
}

function wireLegend(el, ctx, name) {
  for (const b of el.querySelectorAll("[data-focus]")) {
    b.onclick = () => { const g = Number(b.dataset.focus); state.focus = state.focus === g ? null : g; setHtml($("#chart-legend", el), legendHtml(state.detail.node.gpu_latest)); wireLegend(el, ctx, name); drawCharts(el); };
  }
  for (const b of el.querySelectorAll("[data-res]")) {
    b.onclick = () => { state.resolution = b.dataset.res; load(el, ctx, name, false); };
  }
}

function wireActions(el, ctx, name) {
  for (const b of el.querySelectorAll("[data-action]")) {
    b.onclick = async () => {
      const x = ACTIONS.find((a) => a.a === b.dataset.action);
      const reason = await confirmAction(`${x.label}: ${name}`, x.help, { danger: !!x.danger, okLabel: x.label });
      if (reason === null) return;
      try {
        await api.post(`/nodes/${encodeURIComponent(name)}/actions/${x.a}`, reason ? { reason } : {});
        ctx.toast(`${x.label}: done`, "ok");
      } catch (e) {
        ctx.toast(`${x.label} refused: ${e.message}`, "error");
      }
      await load(el, ctx, name, false);
    };
  }
}

function wireAcks(el, ctx, name) {
  for (const b of el.querySelectorAll("[data-ack]")) {
    b.onclick = async () => {
      b.disabled = true;
      try {
        await api.post(`/findings/${b.dataset.ack}/acknowledge`);
        ctx.toast(`finding ${b.dataset.ack} acknowledged`, "ok");
      } catch (e) {
        ctx.toast(`acknowledge refused: ${e.message}`, "error");
      }
      await load(el, ctx, name, false);
    };
  }
}

let resizeObs = null;

export const nodePage = {
  title: (r) => r.arg || "node",
  async render(el, ctx, route) {
    state = { focus: null, resolution: "raw", detail: null, series: [] };
    setHtml(el, html`
      <div class="crumbs"><a href="#/">fleet</a> / <a href="#/nodes">nodes</a> / ${route.arg}</div>
      <section class="panel" id="node-head"></section>
      <section class="panel"><h2>Active findings</h2><div id="findings"></div></section>
      <section class="panel"><h2>Telemetry</h2><div class="legendbar" id="chart-legend"></div><div id="chart-note"></div><div class="charts" id="charts"></div></section>
      <section class="panel"><h2>GPUs</h2><div class="scrollx" id="gpus"></div></section>
      <div class="cols"><section class="panel"><h2>Lifecycle history</h2><div id="history"></div></section>
      <section class="panel narrow"><h2>Device</h2><div id="device"></div></section></div>`);
    let w = 0;
    resizeObs = new ResizeObserver((e) => { const nw = e[0].contentRect.width; if (Math.abs(nw - w) > 8) { w = nw; drawCharts(el); } });
    resizeObs.observe($("#charts", el));
    await load(el, ctx, route.arg, true);
  },
  async refresh(el, ctx, route) {
    if (document.querySelector("dialog[open]")) return; // do not redraw under an open dialog
    await load(el, ctx, route.arg, false);
  },
  destroy() { if (resizeObs) resizeObs.disconnect(); resizeObs = null; },
};
export { raw };
