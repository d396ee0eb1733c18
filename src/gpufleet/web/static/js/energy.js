// Energy view over /api/v1/energy (issue 16): energy per tenant since a chosen time and the
// fleet's idle waste (in-service GPUs idling, in kWh and money). Cost appears only when the
// policy has a price; a tenant token sees only its tenant.
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
}

export const energyView = {
  title: () => "energy",
  async render(el) {
    setHtml(el, html`<section class="panel"><div class="controls"><h2>Idle waste</h2></div><div id="energy-idle" class="fleetbar"></div></section>
      <section class="panel"><div class="controls"><h2>Energy per tenant</h2><label>since <select id="energy-since">${["1d", "7d", "30d", "90d"].map((s) => html`<option ${s === since ? "selected" : ""}>${s}</option>`)}</select></label></div><div id="energy-table" class="scrollx"></div></section>`);
    $("#energy-since", el).onchange = (e) => { since = e.target.value; load(el); };
    await load(el);
  },
  refresh: (el) => load(el),
};
