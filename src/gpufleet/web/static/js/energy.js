// Energy view over /api/v1/energy (issue 16): energy per tenant since a chosen time and the
// fleet's idle waste (in-service GPUs idling, in kWh and money), and what each power order in
// force in that time saved (issue 31: mean power per GPU the hour before vs during, slowdown
// from the jobs' reported progress, "unknown" without it). Cost appears only when the policy
// has a price; a tenant token sees only its tenant.
import * as api from "./api.js";
import { $, html, setHtml } from "./util.js";

let since = "30d";

/** kWh to 4 significant digits (small fleets and short windows use fractions of a kWh). */
export function kwh(v) {
  return v == null ? "—" : Number(v).toPrecision(4);
}

function money(v, cur) {
  return v == null ? "—" : `${Number(v).toFixed(2)} ${cur}`;
}

/** Savings are often cents: 3 significant digits below 1, else 2 decimals. */
function saved(v, cur) {
  if (v == null) return "—";
  const n = Number(v);
  return `${Math.abs(n) < 1 ? n.toPrecision(3) : n.toFixed(2)} ${cur}`;
}

function pct(v) {
  return v == null ? "unknown" : `${(100 * Number(v)).toFixed(1)} %`;
}

function watts(v) {
  return v == null ? "—" : `${Number(v).toFixed(0)} W`;
}

/** One row per power order: watts per GPU before and during, kWh and cost saved, slowdown. */
export function savingsTable(orders, cur) {
  if (!orders || !orders.length) return html`<p class="muted">No power order in force in this time.</p>`;
  return html`<table class="grid" id="energy-orders"><thead><tr><th>order</th><th>state</th><th class="num">GPUs</th><th class="num">before</th><th class="num">during</th><th class="num">GPU-h</th><th class="num">kWh saved</th><th class="num">per GPU-h</th><th class="num">cost saved</th><th class="num">slowdown</th><th class="num">energy / work</th></tr></thead><tbody>
    ${orders.map((o) => html`<tr data-order="${o.order}"><td>${o.order}</td><td>${o.state}</td><td class="num">${o.gpus}</td><td class="num">${watts(o.before_w)}</td><td class="num">${watts(o.during_w)}</td><td class="num">${o.gpu_hours == null ? "—" : Number(o.gpu_hours).toFixed(2)}</td><td class="num" data-field="saved_kwh">${kwh(o.saved_kwh)}</td><td class="num">${kwh(o.saved_kwh_per_gpu_hour)}</td><td class="num" data-field="cost_saved">${saved(o.cost_saved, cur)}</td><td class="num" data-field="slowdown" title="${o.slowdown == null ? "its jobs reported no progress (gpufleet energy progress)" : `from ${o.slowdown_gpus} of ${o.gpus} GPUs`}">${pct(o.slowdown)}</td><td class="num">${o.energy_per_work_saved == null ? "—" : `−${pct(o.energy_per_work_saved)}`}</td></tr>`)}
  </tbody></table><p class="muted small">Mean power per GPU in the hour before each order against during it (whole minutes; the minute the limit changed left out), on the GPUs its agents set, while the same job held them. Slowdown: the jobs' reported throughput during against before.</p>`;
}

async function load(el) {
  const d = await api.get("/energy", { by: "tenant", since });
  const t = d.total;
  setHtml($("#energy-idle", el), html`<div class="kv"><b id="energy-idle-kwh">${kwh(t.idle_kwh)}</b> kWh idle</div>
    <div class="kv"><b id="energy-idle-cost">${money(t.idle_cost, d.currency)}</b></div>
    <div class="kv"><b>${Number(t.idle_gpu_hours).toFixed(1)}</b> idle GPU-hours</div>
    <div class="kv"><b id="energy-total-kwh">${kwh(t.kwh)}</b> kWh in all</div>
    <p class="muted small">In-service GPUs below ${d.idle_util_pct} % utilisation, at the power they drew while idle.${d.price_per_kwh == null ? " No price in the policy (energy_price_per_kwh): no cost." : ""}</p>`);
  setHtml($("#energy-table", el), d.rows.length ? html`<table class="grid" id="energy-tenants"><thead><tr><th>tenant</th><th class="num">kWh</th><th class="num">cost</th><th class="num">kg CO2</th><th class="num">GPU-h</th><th>measured by</th><th class="num">idle kWh</th></tr></thead><tbody>
    ${d.rows.map((r) => html`<tr data-tenant="${r.key}"><td>${r.key}</td><td class="num">${kwh(r.kwh)}</td><td class="num">${money(r.cost, d.currency)}</td><td class="num">${r.co2_kg == null ? "—" : Number(r.co2_kg).toFixed(1)}</td><td class="num">${Number(r.gpu_hours).toFixed(1)}</td><td>${r.method ?? "—"}</td><td class="num">${kwh(r.idle_kwh)}</td></tr>`)}
  </tbody></table>` : html`<p class="muted">No energy measured yet.</p>`);
  setHtml($("#energy-savings", el), savingsTable(d.power_orders, d.currency));
}

export const energyView = {
  title: () => "energy",
  async render(el) {
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Idle waste</h2></div><div id="energy-idle" class="fleetbar"></div></section>
      <section class="panel"><div class="controls"><h2>Energy per tenant</h2><label>since <select id="energy-since">${["1d", "7d", "30d", "90d"].map((s) => html`<option ${s === since ? "selected" : ""}>${s}</option>`)}</select></label></div><div id="energy-table" class="scrollx"></div></section>
      <section class="panel"><div class="controls"><h2>What power orders saved</h2></div><div id="energy-savings" class="scrollx"></div></section>`);
    $("#energy-since", el).onchange = (e) => { since = e.target.value; load(el); };
    await load(el);
  },
  refresh: (el) => load(el),
};
