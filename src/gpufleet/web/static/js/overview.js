// Fleet overview: counts by lifecycle state and health, the heatmap with its metric picker
// and filters, and the list of nodes that need attention. Fleets larger than the page come as
// rack or model groups (the server folds them past the heatmap's cell budget); a click on a
// group adds its nodes below (``expanded``).
import * as api from "./api.js";
import { $, html, setHtml, words, ago, stateBadge, nodeHealthBadge, shownHealth, attentionReason, STATES, HEALTH } from "./util.js";
import { Heatmap, METRICS, legendHtml } from "./heatmap.js";

const ATTENTION_MAX = 200;
let hm = null;
let filters = { metric: "gpu_util_pct", rack: "", model: "", state: "", group: "rack" };
const GROUP_BY = ["rack", "model"];
let expanded = new Set(); // group keys ("" for nodes without a rack/model) whose nodes are drawn
let resizeObs = null;
let lastData = null;

function syncHash() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v && !(k === "metric" && v === "gpu_util_pct") && !(k === "group" && v === "rack")) q.set(k, v);
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
    <label title="when the fleet has more GPUs than the page has room for, one tile per rack or model">group by <select id="f-group">${GROUP_BY.map((g) => opt(g, g, filters.group))}</select></label>
    <span class="legend" id="legend"></span>
  </div>`;
}

function attentionHtml(list, now, worst) {
  // the server picks and orders them: fail, unknown (a lost node counts by what is known
  // now), warn, ok; then by state and name
  const bad = list.nodes;
  if (!bad.length) return html`<p class="muted">Every node shown is in service and healthy.</p>`;
  const rows = bad.map((n) => {
    const why = attentionReason(n, now, worst.get(n.name));
    return html`
    <tr data-node="${n.name}" class="row-h${shownHealth(n)}">
      <td><a href="#/node/${encodeURIComponent(n.name)}">${n.name}</a></td>
      <td>${stateBadge(n.state)}${n.cordoned ? html` <span class="badge cordon">cordoned</span>` : ""}</td>
      <td>${nodeHealthBadge(n, now)}</td><td class="num">${n.findings_active}</td>
      <td>${n.rack ?? ""}</td><td class="reason" title="${why}">${why}</td>
      <td class="muted nowrap">${ago(n.state_since_s, now)}</td></tr>`;
  });
  const more = list.total > bad.length ? html`<p class="muted">and ${list.total - bad.length} more: see <a href="#/nodes">Nodes</a>.</p>` : "";
  return html`<table class="grid" id="attention-table"><thead><tr><th>node</th><th>state</th><th>health</th><th class="num">findings</th><th>rack</th><th>reason</th><th>since</th></tr></thead><tbody>${rows}</tbody></table>${more}`;
}

// The controller's notification outbox per receiver (GET /notifications/status: global
// operators and admins; a viewer's or tenant's page leaves the panel out). Read at most every
// NOTIFY_EVERY_MS (the count is a query of the outbox table, the page refreshes more often).
const NOTIFY_EVERY_MS = 15_000;
let notifyAt = 0;
let notifyAllowed = true;

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

function notifyHtml(doc) {
  const rows = doc.receivers.map((r) => {
    const bad = r.dead > 0 ? "row-h2" : r.pending > 0 && (r.oldest_pending_age_s ?? 0) > 60 ? "row-h1" : "";
    return html`
    <tr data-receiver="${r.receiver}" class="${bad}">
      <td>${r.receiver}</td><td class="num" data-col="pending">${r.pending}</td>
      <td class="num" data-col="in_flight">${r.in_flight}</td><td class="num" data-col="delivered">${r.delivered}</td>
      <td class="num" data-col="failed_attempts">${r.failed_attempts}</td><td class="num" data-col="dead">${r.dead}</td>
      <td class="num" data-col="oldest">${seconds(r.oldest_pending_age_s)}</td>
      <td data-col="last_error">${r.last_error ?? ""}</td></tr>`;
  });
  return html`<table class="grid" id="notify-table"><thead><tr><th>receiver</th><th class="num">pending</th><th class="num">in flight</th><th class="num">delivered</th><th class="num">failed attempts</th><th class="num">dead-lettered</th><th class="num">oldest pending</th><th>last error</th></tr></thead><tbody>${rows}</tbody></table>
  <p class="muted">Dead-lettered notifications were not delivered: their attempts ran out, they grew too old, or the receiver refused them (<code>gpufleet notify status</code>).</p>`;
}

async function loadNotify(el) {
  if (!notifyAllowed || Date.now() - notifyAt < NOTIFY_EVERY_MS) return;
  notifyAt = Date.now();
  const panel = $("#notify-panel", el);
  let doc;
  try {
    doc = await api.get("/notifications/status");
  } catch (e) {
    if (e.status === 401 || e.status === 403) notifyAllowed = false; // not this token's to see
    return;
  }
  if (!panel) return;
  panel.hidden = !doc.receivers.length; // no receivers configured: nothing to show
  setHtml($("#notify", el), notifyHtml(doc));
}

function captionText(data) {
  const m = METRICS[filters.metric];
  const cells = data.values.reduce((a, r) => a + r.length, 0);
  if (!data.groups) return `${data.nodes.length} nodes × ${cells} GPUs shown · ${m.label.toLowerCase()}`;
  const nodes = data.groups.reduce((a, g) => a + g.nodes, 0);
  const gpus = data.groups.reduce((a, g) => a + g.gpus, 0);
  const by = data.group_by === "model" ? "models" : "racks";
  const fig = { mean: "mean", max: "hottest GPU", min: "lowest", worst: "worst node" }[m.agg] || m.agg;
  const open = data.nodes.length ? ` · ${data.nodes.length} nodes of ${expanded.size} expanded shown below` : "";
  return `${data.groups.length} ${by} of ${nodes} nodes × ${gpus} GPUs (more than the page can show one by one) · colour: ${m.label.toLowerCase()}, ${fig} per ${data.group_by}; frame: its worst node · click a ${data.group_by} to show its nodes${open}`;
}

async function load(el, ctx) {
  const q = {
    metric: filters.metric, rack: filters.rack, model: filters.model, state: filters.state,
    group_by: filters.group, max_cells: hm.cellBudget(), expand: [...expanded],
  };
  const sel = { rack: filters.rack, model: filters.model, state: filters.state };
  // the summary is fetched with the heatmap so counts and tiles tell the same story
  const [data, attention, summary, findings] = await Promise.all([
    api.get("/heatmap", q),
    api.get("/nodes", { ...sel, attention: "true", sort: "attention", gpus: "false", limit: ATTENTION_MAX }),
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
  loadNotify(el); // on its own clock, not awaited: the fleet's views do not wait for it
  renderCounts(el, ctx);
  lastData = data;
  hm.draw(data, filters.metric);
  $("#hm-caption", el).textContent = captionText(data);
  $("#hm-collapse", el).hidden = !(data.groups && expanded.size);
  setHtml($("#attention", el), attentionHtml(attention, ctx.summary ? ctx.summary.now_s : undefined, worst));
  if (window.__gpufleetFirstRender === undefined) {
    window.__gpufleetFirstRender = performance.now();
    performance.mark("gpufleet:first-render");
  }
}

async function toggleGroup(el, ctx, key) {
  if (expanded.has(key)) expanded.delete(key);
  else expanded.add(key);
  await load(el, ctx);
  if (expanded.has(key)) {
    // bring the group's nodes into view (they are drawn under the group tiles)
    const top = $("#hm-host", el).getBoundingClientRect().top + window.scrollY + hm.nodesTop - 60;
    window.scrollTo({ top: Math.max(0, top) });
  }
}

function wire(el, ctx) {
  for (const b of el.querySelectorAll("[data-metric]")) {
    b.onclick = () => { filters.metric = b.dataset.metric; syncHash(); renderControls(el, ctx); load(el, ctx); };
  }
  for (const [id, key] of [["#f-rack", "rack"], ["#f-model", "model"], ["#f-state", "state"], ["#f-group", "group"]]) {
    $(id, el).onchange = (e) => {
      filters[key] = e.target.value;
      if (key === "group") expanded = new Set(); // rack keys mean nothing as models
      syncHash(); renderCounts(el, ctx); load(el, ctx);
    };
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
    filters = { metric: "gpu_util_pct", rack: "", model: "", state: "", group: "rack", ...route.params };
    if (!METRICS[filters.metric]) filters.metric = "gpu_util_pct";
    if (!GROUP_BY.includes(filters.group)) filters.group = "rack";
    setHtml(el, html`
      <section id="counts"></section>
      <section class="panel"><div id="controls"></div>
        <div id="hm-host" class="hm-host"></div><div class="caption"><span id="hm-caption"></span>
        <button class="btn small" id="hm-collapse" hidden>collapse all</button></div></section>
      <section class="panel"><h2>Needs attention</h2><div id="attention"></div></section>
      <section class="panel" id="notify-panel" hidden><h2>Notifications</h2><div id="notify"></div></section>`);
    notifyAt = 0;
    notifyAllowed = true;
    renderCounts(el, ctx);
    renderControls(el, ctx);
    hm = new Heatmap($("#hm-host", el), {
      onClick: (name) => ctx.navigate(`#/node/${encodeURIComponent(name)}`),
      onGroup: (key) => toggleGroup(el, ctx, key),
    });
    $("#hm-collapse", el).onclick = () => { expanded = new Set(); load(el, ctx); };
    window.__gpufleetHeatmap = hm;
    let w = 0;
    resizeObs = new ResizeObserver((entries) => {
      const nw = entries[0].contentRect.width;
      if (lastData && Math.abs(nw - w) > 8) { w = nw; hm.draw(lastData, filters.metric); }
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
