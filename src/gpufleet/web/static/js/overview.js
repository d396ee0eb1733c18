// Fleet overview: counts by lifecycle state and health, the heatmap with its metric picker
// and filters, and the list of nodes that need attention.
import * as api from "./api.js";
import { $, html, setHtml, words, ago, stateBadge, nodeHealthBadge, shownHealth, attentionReason, STATES, HEALTH } from "./util.js";
import { Heatmap, METRICS, legendHtml } from "./heatmap.js";

const ATTENTION_MAX = 200;
let hm = null;
let filters = { metric: "gpu_util_pct", rack: "", model: "", state: "" };
let resizeObs = null;
let lastData = null;
let lastExtra = {};

function syncHash() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v && !(k === "metric" && v === "gpu_util_pct")) q.set(k, v);
  const s = q.toString();
  history.replaceState(null, "", `#/${s ? `?${s}` : ""}`);
}

function countsHtml(s) {
  const st = STATES.map((k) => html`
    <button class="count st-${k} ${filters.state === k ? "on" : ""} ${s.by_state[k] ? "" : "zero"}" data-filter-state="${k}" title="show only ${words(k)}">
      <b data-count-state="${k}">${s.by_state[k] ?? 0}</b><span>${words(k)}</span></button>`);
  const hl = HEALTH.map((k) => html`
    <div class="count h-${k} ${s.by_health[k] ? "" : "zero"}"><b data-count-health="${k}">${s.by_health[k] ?? 0}</b><span>${k}</span></div>`);
  return html`<div class="counts"><div class="group"><h3>Lifecycle</h3>${st}</div><div class="group"><h3>Health</h3>${hl}</div></div>`;
}

function controlsHtml(s) {
  const opt = (v, label, sel) => html`<option value="${v}" ${v === sel ? "selected" : ""}>${label}</option>`;
  return html`
  <div class="controls">
    <div class="seg" role="group" aria-label="metric">
      ${Object.entries(METRICS).map(([k, m]) => html`<button data-metric="${k}" class="${k === filters.metric ? "on" : ""}">${m.label}</button>`)}
    </div>
    <label>rack <select id="f-rack">${opt("", "all")}${s.racks.map((r) => opt(r, r, filters.rack))}</select></label>
    <label>model <select id="f-model">${opt("", "all")}${Object.keys(s.by_model).sort().map((m) => opt(m, m, filters.model))}</select></label>
    <label>state <select id="f-state">${opt("", "all")}${STATES.map((k) => opt(k, words(k), filters.state))}</select></label>
    <span class="legend" id="legend"></span>
  </div>`;
}

function attentionHtml(nodes, now, worst) {
  const bad = nodes.filter((n) => n.state !== "in_service" || n.health !== 0 || n.cordoned);
  // a lost node counts by what is known now (unknown), right after the failing ones
  const rank = (n) => [2, 0, 1, 3][shownHealth(n)] ?? 0; // fail, unknown, warn, ok
  bad.sort((a, b) => rank(a) - rank(b) || a.state.localeCompare(b.state) || a.name.localeCompare(b.name));
  if (!bad.length) return html`<p class="muted">Every node shown is in service and healthy.</p>`;
  const rows = bad.slice(0, ATTENTION_MAX).map((n) => {
    const why = attentionReason(n, now, worst.get(n.name));
    return html`
    <tr data-node="${n.name}" class="row-h${shownHealth(n)}">
      <td><a href="#/node/${encodeURIComponent(n.name)}">${n.name}</a></td>
      <td>${stateBadge(n.state)}${n.cordoned ? html` <span class="badge cordon">cordoned</span>` : ""}</td>
      <td>${nodeHealthBadge(n, now)}</td><td class="num">${n.findings_active}</td>
      <td>${n.rack ?? ""}</td><td class="reason" title="${why}">${why}</td>
      <td class="muted nowrap">${ago(n.state_since_s, now)}</td></tr>`;
  });
  const more = bad.length > ATTENTION_MAX ? html`<p class="muted">and ${bad.length - ATTENTION_MAX} more: see <a href="#/nodes">Nodes</a>.</p>` : "";
  return html`<table class="grid" id="attention-table"><thead><tr><th>node</th><th>state</th><th>health</th><th class="num">findings</th><th>rack</th><th>reason</th><th>since</th></tr></thead><tbody>${rows}</tbody></table>${more}`;
}

async function load(el, ctx) {
  const q = { metric: filters.metric, rack: filters.rack, model: filters.model, state: filters.state };
  // the summary is fetched with the heatmap so counts and tiles tell the same story
  const [data, nodes, summary, findings] = await Promise.all([
    api.get("/heatmap", q),
    api.get("/nodes", { rack: filters.rack, model: filters.model, state: filters.state, gpus: "false", limit: 5000 }),
    api.get("/summary"),
    api.get("/findings", { active: "true", limit: 2000 }).catch(() => []),
  ]);
  // each node's worst active finding (newest first among equals): the attention list's reason
  const worst = new Map();
  for (const f of findings) {
    const w = worst.get(f.node);
    if (!w || f.severity > w.severity || (f.severity === w.severity && f.last_seen_s > w.last_seen_s)) worst.set(f.node, f);
  }
  ctx.setSummary(summary);
  renderCounts(el, ctx);
  lastData = data;
  lastExtra = Object.fromEntries(nodes.nodes.map((n) => [n.name, n]));
  hm.draw(data, filters.metric, lastExtra);
  $("#hm-caption", el).textContent = `${data.nodes.length} nodes × ${data.values.reduce((a, r) => a + r.length, 0)} GPUs shown · ${METRICS[filters.metric].label.toLowerCase()}`;
  setHtml($("#attention", el), attentionHtml(nodes.nodes, ctx.summary ? ctx.summary.now_s : undefined, worst));
  if (window.__gpufleetFirstRender === undefined) {
    window.__gpufleetFirstRender = performance.now();
    performance.mark("gpufleet:first-render");
  }
}

function wire(el, ctx) {
  for (const b of el.querySelectorAll("[data-metric]")) {
    b.onclick = () => { filters.metric = b.dataset.metric; syncHash(); renderControls(el, ctx); load(el, ctx); };
  }
  for (const [id, key] of [["#f-rack", "rack"], ["#f-model", "model"], ["#f-state", "state"]]) {
    $(id, el).onchange = (e) => { filters[key] = e.target.value; syncHash(); renderCounts(el, ctx); load(el, ctx); };
  }
  $("#legend", el).innerHTML = legendHtml(filters.metric);
}

function renderControls(el, ctx) {
  setHtml($("#controls", el), controlsHtml(ctx.summary));
  wire(el, ctx);
}

function renderCounts(el, ctx) {
  setHtml($("#counts", el), countsHtml(ctx.summary));
  for (const b of el.querySelectorAll("[data-filter-state]")) {
    b.onclick = () => {
      filters.state = filters.state === b.dataset.filterState ? "" : b.dataset.filterState;
      syncHash(); renderCounts(el, ctx); renderControls(el, ctx); load(el, ctx);
    };
  }
}

export const overview = {
  title: () => "fleet",
  async render(el, ctx, route) {
    filters = { metric: "gpu_util_pct", rack: "", model: "", state: "", ...route.params };
    if (!METRICS[filters.metric]) filters.metric = "gpu_util_pct";
    setHtml(el, html`
      <section id="counts"></section>
      <section class="panel"><div id="controls"></div>
        <div id="hm-host" class="hm-host"></div><div class="caption" id="hm-caption"></div></section>
      <section class="panel"><h2>Needs attention</h2><div id="attention"></div></section>`);
    renderCounts(el, ctx);
    renderControls(el, ctx);
    hm = new Heatmap($("#hm-host", el), { onClick: (name) => ctx.navigate(`#/node/${encodeURIComponent(name)}`) });
    window.__gpufleetHeatmap = hm;
    let w = 0;
    resizeObs = new ResizeObserver((entries) => {
      const nw = entries[0].contentRect.width;
      if (lastData && Math.abs(nw - w) > 8) { w = nw; hm.draw(lastData, filters.metric, lastExtra); }
      w = nw;
    });
    resizeObs.observe($("#hm-host", el));
    await load(el, ctx);
  },
  async refresh(el, ctx) {
    await load(el, ctx);
  },
  destroy() {
    if (resizeObs) resizeObs.disconnect();
    resizeObs = null;
    hm = null;
    lastData = null;
  },
};
