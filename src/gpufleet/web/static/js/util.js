// Small helpers shared by every view: HTML escaping, formatting, DOM building.

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** Escape any value for use inside HTML text or a quoted attribute. */
export function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ESC[c]);
}

/** Tagged template: interpolated values are escaped unless wrapped with raw(). */
export function html(strings, ...vals) {
  let out = strings[0];
  for (let i = 0; i < vals.length; i++) {
    const v = vals[i];
    out += (v && v.__raw !== undefined) ? v.__raw : Array.isArray(v) ? v.map((x) => (x && x.__raw !== undefined ? x.__raw : esc(x))).join("") : esc(v);
    out += strings[i + 1];
  }
  return { __raw: out };
}

export function raw(s) {
  return { __raw: String(s) };
}

export function setHtml(el, frag) {
  el.innerHTML = frag.__raw;
}

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

export const HEALTH = ["ok", "warn", "fail", "unknown"];
export const SEVERITY = ["info", "warn", "fail", "critical"];
export const STATES = ["registering", "validating", "in_service", "draining", "drained", "repair", "lost", "failed"];
export const OUT_STATES = new Set(["draining", "drained", "repair", "lost", "failed"]);

/** "in_service" -> "in service" */
export function words(s) {
  return String(s ?? "").replace(/_/g, " ");
}

/** "drain_and_inspect" -> "Drain and inspect" */
export function sentence(s) {
  const w = words(s);
  return w ? w[0].toUpperCase() + w.slice(1) : "";
}

export function num(v, digits = 0) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "N/A";
  return v.toFixed(digits);
}

export function bytes(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "N/A";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 && i > 0 ? 1 : 0)} ${u[i]}`;
}

function pad(n) { return String(n).padStart(2, "0"); }

/** Absolute time, local: "2025-01-02 13:04:05". */
export function ts(s) {
  if (s === null || s === undefined) return "N/A";
  const d = new Date(s * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Relative age against ``now_s``: "4s", "12m", "3h", "2d". */
export function ago(s, now_s) {
  if (s === null || s === undefined) return "never";
  const d = Math.max(0, (now_s ?? Date.now() / 1000) - s);
  if (d < 90) return `${Math.round(d)}s ago`;
  if (d < 5400) return `${Math.round(d / 60)}m ago`;
  if (d < 86400 * 2) return `${Math.round(d / 3600)}h ago`;
  return `${Math.round(d / 86400)}d ago`;
}

/** A pill for a lifecycle state. */
export function stateBadge(state) {
  return html`<span class="badge st-${state}" data-state="${state}">${words(state)}</span>`;
}

export function healthBadge(h) {
  return html`<span class="badge h-${HEALTH[h] ?? "unknown"}" data-health="${h}">${HEALTH[h] ?? h}</span>`;
}

export function sevBadge(s) {
  return html`<span class="badge sev-${s}">${SEVERITY[s] ?? s}</span>`;
}
