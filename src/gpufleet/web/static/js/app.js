// The dashboard shell: token, role, header counters, hash router and live updates.
import * as api from "./api.js";
import { $, html, setHtml, words, HEALTH, STATES, OUT_STATES } from "./util.js";
import { overview } from "./overview.js";
import { nodePage } from "./node.js";
import { findingsView, eventsView, auditView } from "./lists.js";
import { jobsView } from "./jobs.js";
import { nodesView } from "./nodes.js";
import { energyView } from "./energy.js";
import { maintenanceView } from "./maintenance.js";

const VIEWS = {
  "": overview,
  nodes: nodesView,
  node: nodePage,
  findings: findingsView,
  events: eventsView,
  audit: auditView,
  jobs: jobsView,
  energy: energyView,
  maintenance: maintenanceView,
};
const MIN_REFRESH_MS = 2000; // periodic refreshes: at most every 2 s
const URGENT_REFRESH_MS = 250; // lifecycle/finding events: right away

const ctx = {
  who: null,
  summary: null,
  canOperate: false,
  navigate: (hash) => { location.hash = hash; },
  toast,
  setSummary: (s) => { ctx.summary = s; renderHeader(); },
};
let current = null; // { view, el, params }
let lastRefresh = 0;
let refreshTimer = null;
let lastMessage = 0;
let streamAbort = null;

function parseRoute() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  return { name: parts[0] || "", arg: parts[1], params };
}

export function toast(msg, kind = "info") {
  const box = $("#toasts");
  const el = document.createElement("div");
  el.className = `toast ${kind}`;
  el.textContent = msg;
  box.appendChild(el);
  setTimeout(() => el.remove(), kind === "error" ? 8000 : 4000);
}

function renderHeader() {
  const s = ctx.summary;
  const bar = $("#fleetbar");
  if (!s) return;
  const out = STATES.filter((k) => OUT_STATES.has(k)).reduce((a, k) => a + (s.by_state[k] || 0), 0);
  const r = s.remediation;
  setHtml(bar, html`
    <span class="kv"><b id="hdr-nodes">${s.nodes}</b> nodes</span>
    <span class="kv"><b id="hdr-gpus">${s.gpus}</b> GPUs</span>
    <span class="kv ${out ? "warn" : ""}"><b>${out}</b> out</span>
    <span class="kv ${s.by_health.fail ? "bad" : ""}"><b>${s.by_health.fail}</b> fail</span>
    <span class="kv ${s.findings_active ? "warn" : ""}"><b>${s.findings_active}</b> findings</span>
    ${r.dry_run ? html`<span class="badge sev-1" title="remediation records what it would do">dry run</span>` : ""}
  `);
  const banner = $("#breaker");
  if (r.circuit_open) {
    banner.hidden = false;
    // circuit_message repeats the same figures in a sentence of its own: say it once
    banner.textContent = `Circuit breaker OPEN: ${r.out}/${r.total} nodes out, above the ${(r.max_out_fraction * 100).toFixed(0)} % limit. Automatic drains are stopped (see Events: remediation_blocked); operators can still drain by hand.`;
  } else {
    banner.hidden = true;
  }
}

function setLive(mode) {
  const el = $("#live");
  el.dataset.mode = mode;
  el.textContent = { live: "live", polling: "polling 2s", stale: "stale", off: "offline" }[mode] || mode;
}

async function route() {
  const r = parseRoute();
  const view = VIEWS[r.name] || overview;
  if (current && current.view.destroy) current.view.destroy();
  const main = $("#main");
  main.innerHTML = "";
  const el = document.createElement("div");
  el.className = "view";
  main.appendChild(el);
  current = { view, el, route: r };
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === (r.name === "node" ? "nodes" : r.name));
  }
  document.title = `gpufleet · ${view.title(r)}`;
  try {
    await view.render(el, ctx, r);
  } catch (e) {
    showError(el, e);
  }
  lastRefresh = performance.now();
}

function showError(el, e) {
  const div = document.createElement("div");
  div.className = "error";
  div.textContent = e instanceof api.ApiError ? `API ${e.status}: ${e.message}` : String(e);
  el.prepend(div);
}

/** Refresh the current view now (``urgent``) or within the periodic spacing. */
function scheduleRefresh(urgent) {
  if (!current || !current.view.refresh) return;
  const since = performance.now() - lastRefresh;
  const wait = Math.max(0, (urgent ? URGENT_REFRESH_MS : MIN_REFRESH_MS) - since);
  if (refreshTimer !== null) {
    if (!urgent) return;
    clearTimeout(refreshTimer);
  }
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    lastRefresh = performance.now();
    const c = current;
    try {
      await c.view.refresh(c.el, ctx, c.route);
    } catch (e) {
      if (e instanceof api.ApiError && e.status === 401) return authFailed();
    }
  }, wait);
}

function onSummary(s) {
  const prev = ctx.summary;
  ctx.summary = s;
  renderHeader();
  if (!prev || prev.generation !== s.generation) scheduleRefresh(false);
}

function onEvents(list) {
  const urgent = list.some((e) => e.kind === "transition" || e.kind.startsWith("finding") || e.severity >= 2);
  if (current && current.view.onEvents) current.view.onEvents(current.el, ctx, list);
  scheduleRefresh(urgent);
}

async function liveLoop() {
  let backoff = 1000;
  for (;;) {
    streamAbort = new AbortController();
    try {
      await api.stream((name, data) => {
        lastMessage = performance.now();
        setLive("live");
        backoff = 1000;
        if (name === "summary") onSummary(data);
        else if (name === "events") onEvents(data);
      }, streamAbort.signal);
    } catch (e) {
      if (e instanceof api.ApiError && e.status === 401) return authFailed();
    }
    await new Promise((res) => setTimeout(res, backoff));
    backoff = Math.min(backoff * 2, 15000);
  }
}

/** When the stream is quiet (proxy buffering, disconnect), poll the summary every 2 s. */
function watchdog() {
  setInterval(async () => {
    const quiet = performance.now() - lastMessage;
    if (quiet < 5000) return;
    try {
      const s = await api.get("/summary");
      setLive(quiet > 15000 ? "polling" : "live");
      onSummary(s);
    } catch {
      setLive("off");
    }
  }, 2000);
}

function authFailed() {
  api.setToken(null);
  if (streamAbort) streamAbort.abort();
  showLogin("The token was refused (unknown or revoked). Paste another one.");
}

function showLogin(msg) {
  $("#app").hidden = true;
  const box = $("#login");
  box.hidden = false;
  $("#login-msg").textContent = msg || "";
  $("#login-form").onsubmit = (ev) => {
    ev.preventDefault();
    const t = $("#login-token").value.trim();
    $("#login-token").value = "";
    if (t) { api.setToken(t); start(); }
  };
}

async function start() {
  if (!api.token()) return showLogin("");
  try {
    ctx.who = await api.get("/whoami");
    ctx.summary = await api.get("/summary");
  } catch (e) {
    if (e instanceof api.ApiError && (e.status === 401 || e.status === 403)) return authFailed();
    return showLogin(`Cannot reach the control plane: ${e.message}`);
  }
  ctx.canOperate = ["operator", "admin"].includes(ctx.who.role);
  document.body.dataset.role = ctx.who.role;
  $("#login").hidden = true;
  $("#app").hidden = false;
  setHtml($("#who"), html`<span class="badge role-${ctx.who.role}" id="role">${ctx.who.role}</span> ${ctx.who.name}${ctx.who.tenant ? html` · tenant ${ctx.who.tenant}` : ""}`);
  $("#nav-audit").hidden = !ctx.canOperate;
  $("#version").textContent = `v${ctx.summary.version}`;
  $("#logout").onclick = () => { api.setToken(null); location.hash = "#/"; location.reload(); };
  renderHeader();
  setLive("polling");
  window.addEventListener("hashchange", route);
  await route();
  liveLoop();
  watchdog();
}

api.adoptTokenFromFragment();
start();
export { HEALTH, words };
