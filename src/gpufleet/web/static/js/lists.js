// Findings, events and audit log: filtered tables, newest first.
import * as api from "./api.js";
import { $, html, setHtml, sentence, ts, ago, sevBadge } from "./util.js";

const nodeLink = (n) => (n ? html`<a href="#/node/${encodeURIComponent(n)}">${n}</a>` : html`<span class="muted">fleet</span>`);

// -- findings -----------------------------------------------------------------------------------
let ff = { active: "true", severity: "", node: "" };

async function loadFindings(el, ctx) {
  const list = await api.get("/findings", { active: ff.active === "all" ? null : ff.active, severity: ff.severity, node: ff.node, limit: 1000 });
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  $("#f-count", el).textContent = `${list.length} finding${list.length === 1 ? "" : "s"}`;
  setHtml($("#f-table", el), list.length ? html`<table class="grid" id="findings-table"><thead><tr><th>id</th><th>sev</th><th>node</th><th>GPU</th><th>code</th><th>message</th><th>recommended action</th><th>first seen</th><th>last seen</th><th>state</th><th>ack</th></tr></thead><tbody>
    ${list.map((f) => html`<tr data-finding="${f.id}" class="row-h${Math.min(f.severity, 2)}"><td class="num mono">${f.id}</td><td>${sevBadge(f.severity)}</td><td>${nodeLink(f.node)}</td><td class="num">${f.gpu_index ?? "—"}</td>
      <td class="mono">${f.code}</td><td>${f.message}</td><td><b>${sentence(f.action)}</b></td>
      <td class="nowrap" title="${ts(f.first_seen_s)}">${ago(f.first_seen_s, now)}</td><td class="nowrap" title="${ts(f.last_seen_s)}">${ago(f.last_seen_s, now)}</td>
      <td>${f.active ? "active" : html`<span class="muted">cleared</span>`}</td>
      <td>${f.acknowledged_by ? html`<span class="muted" title="${ts(f.acknowledged_s)}">✓ ${f.acknowledged_by}</span>` : ctx.canOperate && f.active ? html`<button class="btn small" data-ack="${f.id}">Acknowledge</button>` : html`<span class="muted">—</span>`}</td></tr>`)}
    </tbody></table>` : html`<p class="muted">No findings match.</p>`);
  for (const b of el.querySelectorAll("[data-ack]")) {
    b.onclick = async () => {
      b.disabled = true;
      try { await api.post(`/findings/${b.dataset.ack}/acknowledge`); ctx.toast(`finding ${b.dataset.ack} acknowledged`, "ok"); } catch (e) { ctx.toast(`acknowledge refused: ${e.message}`, "error"); }
      await loadFindings(el, ctx);
    };
  }
}

export const findingsView = {
  title: () => "findings",
  async render(el, ctx, route) {
    ff = { active: "true", severity: "", node: "", ...route.params };
    setHtml(el, html`<section class="panel"><div class="controls">
      <h2>Findings</h2>
      <label>show <select id="ff-active"><option value="true">active</option><option value="false">cleared</option><option value="all">all</option></select></label>
      <label>severity ≥ <select id="ff-sev"><option value="">any</option><option value="1">warn</option><option value="2">fail</option></select></label>
      <label>node <input id="ff-node" size="14" placeholder="name"></label><span class="muted" id="f-count"></span></div>
      <div id="f-table" class="scrollx"></div></section>`);
    $("#ff-active", el).value = ff.active; $("#ff-sev", el).value = ff.severity; $("#ff-node", el).value = ff.node;
    $("#ff-active", el).onchange = (e) => { ff.active = e.target.value; loadFindings(el, ctx); };
    $("#ff-sev", el).onchange = (e) => { ff.severity = e.target.value; loadFindings(el, ctx); };
    $("#ff-node", el).onchange = (e) => { ff.node = e.target.value.trim(); loadFindings(el, ctx); };
    await loadFindings(el, ctx);
  },
  refresh: (el, ctx) => loadFindings(el, ctx),
};

// -- events -------------------------------------------------------------------------------------
let ef = { kind: "", node: "" };

function eventRow(e) {
  return html`<tr class="row-h${Math.min(e.severity, 2)}" data-event="${e.id}"><td class="nowrap mono">${ts(e.at_s)}</td><td>${sevBadge(e.severity)}</td><td>${nodeLink(e.node)}</td><td class="mono">${e.kind}</td><td>${e.message}</td></tr>`;
}

async function loadEvents(el) {
  const list = await api.get("/events", { kind: ef.kind, node: ef.node, limit: 500 });
  setHtml($("#e-table", el), html`<table class="grid" id="events-table"><thead><tr><th>when</th><th>sev</th><th>node</th><th>kind</th><th>message</th></tr></thead><tbody>${list.map(eventRow)}</tbody></table>`);
}

export const eventsView = {
  title: () => "events",
  async render(el, ctx, route) {
    ef = { kind: "", node: "", ...route.params };
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Events</h2>
      <label>kind <input id="ef-kind" size="18" placeholder="e.g. transition"></label>
      <label>node <input id="ef-node" size="14" placeholder="name"></label><span class="muted">newest first · live</span></div>
      <div id="e-table" class="scrollx"></div></section>`);
    $("#ef-kind", el).value = ef.kind; $("#ef-node", el).value = ef.node;
    $("#ef-kind", el).onchange = (e) => { ef.kind = e.target.value.trim(); loadEvents(el); };
    $("#ef-node", el).onchange = (e) => { ef.node = e.target.value.trim(); loadEvents(el); };
    await loadEvents(el);
  },
  onEvents(el, _ctx, list) {
    const body = el.querySelector("#events-table tbody");
    if (!body) return;
    const keep = list.filter((e) => (!ef.kind || e.kind === ef.kind) && (!ef.node || e.node === ef.node) && !body.querySelector(`[data-event="${e.id}"]`));
    if (keep.length) body.insertAdjacentHTML("afterbegin", keep.slice().reverse().map((e) => eventRow(e).__raw).join(""));
    while (body.rows.length > 1000) body.deleteRow(-1);
  },
};

// -- audit --------------------------------------------------------------------------------------
export const auditView = {
  title: () => "audit",
  async render(el, ctx) {
    if (!ctx.canOperate) {
      setHtml(el, html`<section class="panel"><h2>Audit log</h2><p class="muted">The audit log needs an operator or admin token.</p></section>`);
      return;
    }
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Audit log</h2><span class="muted">every write, allowed or refused</span></div><div id="a-table" class="scrollx"></div></section>`);
    await this.refresh(el);
  },
  async refresh(el) {
    const host = $("#a-table", el);
    if (!host) return;
    const list = await api.get("/audit", { limit: 500 });
    setHtml(host, html`<table class="grid" id="audit-table"><thead><tr><th>when</th><th>actor</th><th>role</th><th>action</th><th>target</th><th>outcome</th><th>detail</th></tr></thead><tbody>
      ${list.map((a) => html`<tr class="${a.outcome === "ok" ? "" : "row-h2"}"><td class="nowrap mono">${ts(a.at_s)}</td><td class="mono">${a.actor}</td><td>${a.role}</td><td class="mono">${a.action}</td><td>${a.target}</td><td>${a.outcome}</td><td class="mono small">${JSON.stringify(a.detail)}</td></tr>`)}
    </tbody></table>`);
  },
};
