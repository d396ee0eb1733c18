// Jobs view over /api/v1/jobs (the embedded scheduler's endpoints). A 404 means the
// controller runs without a scheduler: the view says so instead of failing.
import * as api from "./api.js";
import { $, html, setHtml, ts, ago } from "./util.js";
import { confirmAction } from "./dialog.js";

const ACTIVE = new Set(["pending", "queued", "running", "starting", "requeued"]);
let stateFilter = "";

function dur(a, b) {
  if (!a) return "—";
  const s = Math.max(0, (b ?? Date.now() / 1000) - a);
  if (s < 120) return `${Math.round(s)}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

async function load(el, ctx) {
  let data;
  try {
    data = await api.get("/jobs");
  } catch (e) {
    if (e instanceof api.ApiError && e.status === 404) {
      setHtml($("#j-table", el), html`<div class="empty" id="jobs-disabled"><b>scheduler not enabled</b><p class="muted">This controller runs without a scheduler (the jobs endpoints answer 404). Start it with the embedded scheduler, or use Slurm or Kubernetes for jobs.</p></div>`);
      $("#j-count", el).textContent = "";
      return;
    }
    throw e;
  }
  const jobs = (data.jobs || []).filter((j) => !stateFilter || j.state === stateFilter);
  const now = ctx.summary ? ctx.summary.now_s : undefined;
  const states = [...new Set((data.jobs || []).map((j) => j.state))].sort();
  $("#j-count", el).textContent = `${jobs.length} of ${(data.jobs || []).length} jobs`;
  const sel = $("#j-state", el);
  sel.innerHTML = `<option value="">all</option>${states.map((s) => html`<option ${s === stateFilter ? "selected" : ""}>${s}</option>`.__raw).join("")}`;
  setHtml($("#j-table", el), jobs.length ? html`<table class="grid" id="jobs-table"><thead><tr><th>id</th><th>name</th><th>tenant</th><th>state</th><th class="num">prio</th><th class="num">GPUs</th><th>nodes</th><th class="num">restarts</th><th>submitted</th><th>runtime</th><th>exit / reason</th>${ctx.canOperate ? html`<th></th>` : ""}</tr></thead><tbody>
    ${jobs.map((j) => html`<tr data-job="${j.id}" class="${j.state === "failed" ? "row-h2" : ""}"><td class="mono">${j.id}</td><td>${j.name}</td><td>${j.tenant ?? "—"}</td><td><span class="badge job-${j.state}">${j.state}</span></td><td class="num">${j.priority ?? ""}</td><td class="num">${j.gpus ?? ""}</td>
      <td class="mono small">${(j.nodes || []).map((n, i) => html`${i ? ", " : ""}<a href="#/node/${encodeURIComponent(n)}">${n}</a>`)}</td><td class="num">${j.restarts ?? 0}</td>
      <td class="nowrap" title="${ts(j.submitted_at_s)}">${ago(j.submitted_at_s, now)}</td><td class="num">${dur(j.started_at_s, j.ended_at_s ?? now)}</td>
      <td>${j.exit_code ?? ""}${j.reason ? html` <span class="muted">${j.reason}</span>` : ""}</td>
      ${ctx.canOperate ? html`<td>${ACTIVE.has(j.state) ? html`<button class="btn small danger" data-cancel="${j.id}">Cancel</button>` : ""}</td>` : ""}</tr>`)}
  </tbody></table>` : html`<p class="muted">No jobs.</p>`);
  for (const b of el.querySelectorAll("[data-cancel]")) {
    b.onclick = async () => {
      const reason = await confirmAction(`Cancel job ${b.dataset.cancel}`, "The job is stopped on every node it runs on.", { danger: true, okLabel: "Cancel job" });
      if (reason === null) return;
      try { await api.post(`/jobs/${encodeURIComponent(b.dataset.cancel)}/cancel`, {}); ctx.toast(`job ${b.dataset.cancel} cancelled`, "ok"); } catch (e) { ctx.toast(`cancel refused: ${e.message}`, "error"); }
      await load(el, ctx);
    };
  }
}

export const jobsView = {
  title: () => "jobs",
  async render(el, ctx) {
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Jobs</h2><label>state <select id="j-state"><option value="">all</option></select></label><span class="muted" id="j-count"></span></div><div id="j-table" class="scrollx"></div></section>`);
    $("#j-state", el).onchange = (e) => { stateFilter = e.target.value; load(el, ctx); };
    await load(el, ctx);
  },
  refresh: (el, ctx) => load(el, ctx),
};
