// Nodes table: every node with state, health, rack, findings and its GPUs' mean figures;
// sortable by any column. One innerHTML write per refresh keeps 1,000 rows cheap.
import * as api from "./api.js";
import { $, html, setHtml, num, ago, stateBadge, nodeHealthBadge, shownHealth, isStale, dataAge } from "./util.js";

let sortKey = "name";
let sortDir = 1;
let text = "";

function mean(gpus, f) {
  const v = gpus.map((g) => g.metrics[f]).filter((x) => x !== null && x !== undefined);
  return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
}

async function load(el, ctx) {
  const data = await api.get("/nodes", { gpus: "true", limit: 5000 });
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  // a lost node's last figures are history: shown apart ("as of 5m ago"), never as current
  let rows = data.nodes.map((n) => ({
    n, name: n.name, state: n.state, health: shownHealth(n), stale: isStale(n), rack: n.rack || "", model: n.model || "",
    findings: n.findings_active, util: mean(n.gpu_latest, "gpu_util_pct"), power: n.gpu_latest.reduce((a, g) => a + (g.metrics.power_w || 0), 0),
    temp: Math.max(-Infinity, ...n.gpu_latest.map((g) => g.metrics.gpu_temp_c ?? -Infinity)), seen: n.last_seen_s ?? 0,
  }));
  if (text) rows = rows.filter((r) => r.name.includes(text) || r.rack.includes(text) || r.state.includes(text));
  rows.sort((a, b) => (a[sortKey] < b[sortKey] ? -sortDir : a[sortKey] > b[sortKey] ? sortDir : 0));
  const th = (k, label, cls = "") => html`<th class="sortable ${cls} ${sortKey === k ? (sortDir > 0 ? "asc" : "desc") : ""}" data-sort="${k}">${label}</th>`;
  setHtml($("#n-table", el), html`<table class="grid" id="nodes-table"><thead><tr>${th("name", "node")}${th("state", "state")}${th("health", "health")}${th("rack", "rack")}${th("model", "model")}${th("findings", "findings", "num")}${th("util", "mean util", "num")}${th("power", "power", "num")}${th("temp", "max temp", "num")}${th("seen", "last seen")}</tr></thead><tbody>
    ${rows.map((r) => html`<tr class="row-h${r.health}" data-node="${r.name}"><td><a href="#/node/${encodeURIComponent(r.name)}">${r.name}</a></td><td>${stateBadge(r.state)}${r.n.cordoned ? html` <span class="badge cordon">cordoned</span>` : ""}</td><td>${nodeHealthBadge(r.n, now)}</td><td>${r.rack}</td><td>${r.model}</td><td class="num">${r.findings}</td>${r.stale ? html`<td class="num muted stale-fig" colspan="3" title="last report ${num(r.util)} % · ${num(r.power / 1000, 2)} kW">no data for ${dataAge(r.n, now)}</td>` : html`<td class="num">${num(r.util)} %</td><td class="num">${num(r.power / 1000, 2)} kW</td><td class="num">${Number.isFinite(r.temp) ? `${r.temp.toFixed(0)} °C` : "N/A"}</td>`}<td class="nowrap">${ago(r.n.last_seen_s, now)}</td></tr>`)}
  </tbody></table>`);
  $("#n-count", el).textContent = `${rows.length} of ${data.total} nodes`;
  for (const h of el.querySelectorAll("[data-sort]")) {
    h.onclick = () => { if (sortKey === h.dataset.sort) sortDir = -sortDir; else { sortKey = h.dataset.sort; sortDir = 1; } load(el, ctx); };
  }
}

export const nodesView = {
  title: () => "nodes",
  async render(el, ctx) {
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Nodes</h2><label>filter <input id="n-filter" size="18" placeholder="name, rack or state" value="${text}"></label><span class="muted" id="n-count"></span></div><div id="n-table" class="scrollx"></div></section>`);
    $("#n-filter", el).oninput = (e) => { text = e.target.value.trim(); load(el, ctx); };
    await load(el, ctx);
  },
  refresh: (el, ctx) => load(el, ctx),
};
