// Maintenance campaigns (issue 15): the list (proposed ones included) with the recurring
// policy's next occurrence, and one campaign: nodes by step, in-service capacity over time
// against the floor (from the capacity each step recorded), failures with their reasons, and
// start/pause/resume/abort for operators and admins of no tenant (the API refuses the rest).
import * as api from "./api.js";
import { $, html, setHtml, ts, ago, words } from "./util.js";
import { lineChart } from "./chart.js";
import { confirmAction } from "./dialog.js";

const STEPS = ["selected", "cordoned", "draining", "updating", "rebooting", "verifying", "validating", "done", "failed", "skipped"];
const ACTIONS = { // campaign state -> the actions it allows
  proposed: ["start", "abort"],
  running: ["pause", "abort"],
  paused: ["resume", "abort"],
  halted: ["abort"],
};
const CONFIRM = {
  start: ["Start the proposed campaign", "Its nodes are cordoned, drained and updated in its windows, never below the floor.", false],
  abort: ["Abort the campaign", "Nodes not yet updated go back to service; nodes in their update finish it.", true],
};

const canSteer = (ctx) => ctx.canOperate && ctx.who && !ctx.who.tenant;
const pct = (v) => (v === null || v === undefined ? "—" : `${(v * 100).toFixed(1)} %`);

function stateBadge(state) {
  const cls = { running: "sev-0", done: "sev-0", proposed: "job-pending", paused: "sev-1", halted: "sev-2", aborted: "sev-1" }[state] || "";
  return html`<span class="badge ${cls}" id="mc-state" data-state="${state}">${state}</span>`;
}

function stepCounts(byStep) {
  const shown = STEPS.filter((s) => byStep[s]);
  if (!shown.length) return html`<span class="muted">no node</span>`;
  return html`${shown.map((s) => html`<span class="kv mc-step" data-step-count="${s}"><b>${byStep[s]}</b> ${words(s)}</span> `)}`;
}

/** In-service GPUs as a step line (each value holds until the next sample) against the floor. */
export function capacityChart(doc, width) {
  const cap = doc.capacity;
  if (!cap || !cap.history || !cap.history.length) return html`<p class="muted">capacity not shown to this token</p>`;
  const t = [], v = [];
  for (const p of cap.history) {
    const frac = p.fleet_gpus ? (100 * p.in_service_gpus) / p.fleet_gpus : null;
    if (t.length) { t.push(p.t); v.push(v[v.length - 1]); }
    t.push(p.t); v.push(frac);
  }
  const svg = lineChart({
    title: "GPUs in service", unit: "% of the fleet", series: [{ gpu: 0, t, v }],
    refs: [{ value: doc.floor * 100, label: `floor ${Math.round(doc.floor * 100)} %` }],
    yMin: 0, yMax: 100, width, height: 200,
  });
  return html`<div id="mc-chart" data-points="${cap.history.length}">${{ __raw: svg }}</div>`;
}

async function renderList(el, ctx) {
  const [rows, pol] = await Promise.all([api.get("/maintenance/campaigns"), api.get("/maintenance/policy")]);
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  const next = pol.next;
  setHtml(el, html`<section class="panel" id="mc-policy"><h2>Maintenance</h2>
    ${next ? html`<p>Recurring policy: <b>${pol.policy.every}</b>, ${pol.policy.on}, ${pol.policy.window}. Next occurrence <b id="mc-next">${ts(Date.parse(next.start) / 1000)}</b> (a campaign is proposed from ${ts(Date.parse(next.propose_from) / 1000)} when nodes are out of baseline).</p>`
      : html`<p class="muted">No recurring maintenance policy (<code>maintenance:</code> in the controller's policy).</p>`}
    </section>
    <section class="panel"><h2>Campaigns</h2>
    ${rows.length ? html`<table class="grid" id="mc-list"><thead><tr><th>id</th><th>state</th><th>created</th><th>by</th><th class="num">nodes</th><th>steps</th><th class="num">failures</th><th>reason</th></tr></thead><tbody>
      ${rows.map((c) => html`<tr data-campaign="${c.id}"><td><a href="#/maintenance/${c.id}">${c.id}</a></td><td>${stateBadge(c.state)}</td><td title="${ts(c.created_s)}">${ago(c.created_s, now)}</td><td class="small">${c.created_by}</td><td class="num">${c.nodes}</td><td class="small">${stepCounts(c.by_step)}</td><td class="num">${c.failures}</td><td class="muted small">${c.reason}</td></tr>`)}
    </tbody></table>` : html`<p class="muted">No campaign yet (<code>gpufleet maintenance start</code>).</p>`}
    </section>`);
}

async function renderOne(el, ctx, id) {
  const doc = await api.get(`/maintenance/campaigns/${encodeURIComponent(id)}`);
  const acts = canSteer(ctx) ? ACTIONS[doc.state] || [] : [];
  const failed = doc.nodes.filter((n) => n.step === "failed");
  const cap = doc.capacity;
  const width = Math.min(900, Math.max(320, (el.clientWidth || 900) - 40));
  setHtml(el, html`<section class="panel" id="mc-head" data-campaign="${doc.id}">
      <div class="controls"><h2>Campaign ${doc.id}</h2>${stateBadge(doc.state)}<span class="muted">${doc.reason}</span>
      <span id="mc-buttons">${acts.map((a) => html`<button class="btn small ${a === "abort" ? "danger" : a === "start" ? "primary" : ""}" id="mc-${a}" data-action="${a}">${a[0].toUpperCase() + a.slice(1)}</button> `)}</span></div>
      <p class="small">failures ${doc.failures}/${doc.max_failures} · batch ${doc.batch} · floor ${Math.round(doc.floor * 100)} % · windows ${doc.windows.join(", ")} · created by ${doc.created_by} ${ts(doc.created_s)}
      ${cap ? html` · in service now ${cap.in_service_gpus}/${cap.fleet_gpus} GPUs (${pct(cap.in_service_fraction)})` : ""}</p>
      <div id="mc-steps">${stepCounts(doc.by_step)}</div>
    </section>
    <section class="panel">${capacityChart(doc, width)}</section>
    ${failed.length ? html`<section class="panel" id="mc-failures"><h3>Failures</h3><ul>${failed.map((n) => html`<li data-node="${n.node}"><a href="#/node/${encodeURIComponent(n.node)}">${n.node}</a>: ${n.reason}</li>`)}</ul></section>` : ""}
    <section class="panel"><h3>Nodes by step</h3><table class="grid" id="mc-nodes"><thead><tr><th>#</th><th>node</th><th>rack</th><th>step</th><th>since</th><th>reason</th></tr></thead><tbody>
      ${STEPS.flatMap((s) => doc.nodes.filter((n) => n.step === s)).map((n) => html`<tr data-node="${n.node}" data-step="${n.step}" class="${n.step === "failed" ? "row-h2" : ""}"><td class="num">${n.order}</td><td><a href="#/node/${encodeURIComponent(n.node)}">${n.node}</a></td><td>${n.domain}</td><td><span class="badge">${words(n.step)}</span></td><td title="${ts(n.since_s)}">${ago(n.since_s, ctx.summary ? ctx.summary.now_s : undefined)}</td><td class="muted small">${n.reason}</td></tr>`)}
    </tbody></table></section>`);
  for (const b of el.querySelectorAll("[data-action]")) {
    b.onclick = async () => {
      const a = b.dataset.action;
      if (CONFIRM[a]) {
        const [title, body, danger] = CONFIRM[a];
        if ((await confirmAction(`${title} ${doc.id}`, body, { danger, okLabel: a[0].toUpperCase() + a.slice(1) })) === null) return;
      }
      try {
        await api.post(`/maintenance/campaigns/${doc.id}/${a}`, {});
        ctx.toast(`campaign ${doc.id}: ${a}`, "ok");
      } catch (e) {
        ctx.toast(`${a} refused: ${e.message}`, "error");
      }
      await renderOne(el, ctx, id);
    };
  }
}

export const maintenanceView = {
  title: (r) => (r.arg ? `campaign ${r.arg}` : "maintenance"),
  render: (el, ctx, r) => (r.arg ? renderOne(el, ctx, r.arg) : renderList(el, ctx)),
  refresh: (el, ctx, r) => (r.arg ? renderOne(el, ctx, r.arg) : renderList(el, ctx)),
};
