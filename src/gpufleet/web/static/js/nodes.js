// Nodes table: every node with state, health, rack, findings and its GPUs' mean figures;
// sortable by any column. The server searches, sorts and pages (PAGE rows at a time), so a
// 10,000-node fleet costs the page what 100 nodes do.
import * as api from "./api.js";
import { $, html, setHtml, num, ago, stateBadge, nodeHealthBadge, shownHealth, isStale, dataAge } from "./util.js";

const PAGE = 100;
let sortKey = "name";
let sortDir = 1;
let text = "";
let page = 0;

function mean(gpus, f) {
  const v = gpus.map((g) => g.metrics[f]).filter((x) => x !== null && x !== undefined);
  return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
}

async function load(el, ctx) {
  const data = await api.get("/nodes", {
    gpus: "true", limit: PAGE, offset: page * PAGE, sort: sortKey, desc: sortDir < 0 ? "true" : "", q: text,
  });
  if (!data.nodes.length && page > 0 && data.total > 0) { // the fleet shrank under this page
    page = Math.floor((data.total - 1) / PAGE);
    return load(el, ctx);
  }
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  // a lost node's last figures are history: shown apart ("as of 5m ago"), never as current
  const rows = data.nodes.map((n) => ({
    n, name: n.name, state: n.state, health: shownHealth(n), stale: isStale(n), rack: n.rack || "", model: n.model || "",
    findings: n.findings_active, util: mean(n.gpu_latest, "gpu_util_pct"), power: n.gpu_latest.reduce((a, g) => a + (g.metrics.power_w || 0), 0),
    temp: Math.max(-Infinity, ...n.gpu_latest.map((g) => g.metrics.gpu_temp_c ?? -Infinity)), seen: n.last_seen_s ?? 0,
  }));
  const th = (k, label, cls = "") => html`<th class="sortable ${cls} ${sortKey === k ? (sortDir > 0 ? "asc" : "desc") : ""}" data-sort="${k}">${label}</th>`;
  setHtml($("#n-table", el), html`<table class="grid" id="nodes-table"><thead><tr>${th("name", "node")}${th("state", "state")}${th("health", "health")}${th("rack", "rack")}${th("model", "model")}${th("findings", "findings", "num")}${th("util", "mean util", "num")}${th("power", "power", "num")}${th("temp", "max temp", "num")}${th("seen", "last seen")}</tr></thead><tbody>
    ${rows.map((r) => html`<tr class="row-h${r.health}" data-node="${r.name}"><td><a href="#/node/${encodeURIComponent(r.name)}">${r.name}</a></td><td>${stateBadge(r.state)}${r.n.cordoned ? html` <span class="badge cordon">cordoned</span>` : ""}</td><td>${nodeHealthBadge(r.n, now)}</td><td>${r.rack}</td><td>${r.model}</td><td class="num">${r.findings}</td>${r.stale ? html`<td class="num muted stale-fig" colspan="3" title="last report ${num(r.util)} % · ${num(r.power / 1000, 2)} kW">no data for ${dataAge(r.n, now)}</td>` : html`<td class="num">${num(r.util)} %</td><td class="num">${num(r.power / 1000, 2)} kW</td><td class="num">${Number.isFinite(r.temp) ? `${r.temp.toFixed(0)} °C` : "N/A"}</td>`}<td class="nowrap">${ago(r.n.last_seen_s, now)}</td></tr>`)}
  </tbody></table>`);
  const first = data.total ? page * PAGE + 1 : 0;
  $("#n-count", el).textContent = `${first}-${page * PAGE + rows.length} of ${data.total} nodes`;
  $("#n-prev", el).disabled = page === 0;
  $("#n-next", el).disabled = (page + 1) * PAGE >= data.total;
  for (const h of el.querySelectorAll("[data-sort]")) {
    h.onclick = () => {
      if (sortKey === h.dataset.sort) sortDir = -sortDir; else { sortKey = h.dataset.sort; sortDir = 1; }
      page = 0;
      load(el, ctx);
    };
  }
}

export const nodesView = {
  title: () => "nodes",
  async render(el, ctx) {
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Nodes</h2><label>filter <input id="n-filter" size="18" placeholder="name, rack or state" value="${text}"></label><span class="muted" id="n-count"></span>
      <button class="btn small" id="n-prev" title="previous ${PAGE}">‹ prev</button><button class="btn small" id="n-next" title="next ${PAGE}">next ›</button></div><div id="n-table" class="scrollx"></div></section>`);
    $("#n-filter", el).oninput = (e) => { text = e.target.value.trim(); page = 0; load(el, ctx); };
    $("#n-prev", el).onclick = () => { page = Math.max(0, page - 1); load(el, ctx); };
    $("#n-next", el).onclick = () => { page += 1; load(el, ctx); };
    await load(el, ctx);
  },
  refresh: (el, ctx) => load(el, ctx),
};
