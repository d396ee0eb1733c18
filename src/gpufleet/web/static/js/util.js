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

/** Whether a node's reported figures are not current: the controller declared it lost (no
 * heartbeat for its threshold), so its last health and samples are history, not now. */
export function isStale(n) {
  return n.state === "lost";
}

/** Age of a node's newest data: "5m", or "never". */
export function dataAge(n, now_s) {
  return n.last_seen_s === null || n.last_seen_s === undefined ? "never" : ago(n.last_seen_s, now_s).replace(/ ago$/, "");
}

/** The health pill for a node: "unknown" plus the age of its data while its figures are not
 * current (the last reported health only in the tooltip), else its health. */
export function nodeHealthBadge(n, now_s) {
  if (!isStale(n)) return healthBadge(n.health);
  const last = HEALTH[n.health] ?? n.health;
  return html`${healthBadge(3)} <span class="badge stale-b" data-stale-age="${dataAge(n, now_s)}" title="no data since ${ts(n.last_seen_s)}; the last report said ${last}">data ${dataAge(n, now_s)} old</span>`;
}

/** The health to sort and colour by: 3 (unknown) for a node whose figures are not current. */
export function shownHealth(n) {
  return isStale(n) ? 3 : n.health;
}

/** Why a node needs attention, in one line: its worst active finding while it is in service
 * or validating (its state reason says how it got there, not what is wrong now), how long it
 * has been silent when lost, the drain reason when out of service. ``worst``: the node's worst
 * active finding, or undefined. */
export function attentionReason(n, now_s, worst) {
  const finding = worst ? `${worst.code}: ${worst.message}` : ""; // the message names the GPU
  const more = n.findings_active > 1 ? ` (+${n.findings_active - 1} more finding${n.findings_active > 2 ? "s" : ""})` : "";
  if (n.state === "lost") return `no data for ${dataAge(n, now_s)}: ${n.state_reason}`;
  if (n.reason && n.reason !== n.state_reason) return finding ? `${n.reason}: ${finding}` : n.reason; // e.g. drain blocked by the circuit breaker
  if (n.state === "in_service") {
    if (finding) return finding + more;
    if (n.cordoned) return "cordoned: no new work is placed here";
    if (n.health !== 0) return `health ${HEALTH[n.health] ?? n.health} reported by the agent`;
    return n.state_reason;
  }
  if (n.state === "validating") {
    const wait = `waiting for a passing validation (${n.state_reason})`;
    return finding ? `${finding}${more}; ${wait}` : wait;
  }
  return n.state_reason || words(n.state);
}
