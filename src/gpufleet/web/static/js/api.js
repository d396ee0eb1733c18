// REST client for /api/v1. The token comes from the URL fragment (#token=...), which
// browsers never send to the server; it is kept in sessionStorage and only ever travels in
// the Authorization header, never in a URL query and never to the console.

const KEY = "gpufleet.token";
const BASE = "/api/v1";

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
  }
}

/** Move a token found in the fragment into sessionStorage and drop it from the address bar. */
export function adoptTokenFromFragment() {
  const m = /(?:^#|[#&])token=([^&]+)/.exec(location.hash);
  if (!m) return false;
  sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
  // "#token=T&/node/x" or "#/node/x&token=T" -> "#/node/x"
  const rest = location.hash.slice(1).split("&").filter((p) => p && !p.startsWith("token=")).join("&");
  history.replaceState(null, "", `${location.pathname}#${rest.startsWith("/") ? rest : `/${rest}`}`);
  return true;
}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  if (t) sessionStorage.setItem(KEY, t.trim());
  else sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

/** Build "/api/v1/path?k=v" from a params object (arrays repeat the key; null is left out). */
export function url(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v === null || v === undefined || v === "") continue;
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else q.append(k, v);
  }
  const s = q.toString();
  return BASE + path + (s ? `?${s}` : "");
}

async function call(method, path, params, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const r = await fetch(url(path, params), init);
  if (r.status === 204) return null;
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) throw new ApiError(r.status, (data && data.detail) || r.statusText);
  return data;
}

export const get = (path, params) => call("GET", path, params);
export const post = (path, body) => call("POST", path, null, body || {});

/**
 * Read the server-sent event stream with fetch() (EventSource cannot send headers).
 * ``onEvent(name, data)`` gets each parsed message; resolves when the stream ends.
 */
export async function stream(onEvent, signal) {
  const r = await fetch(url("/stream"), { headers: headers({ Accept: "text/event-stream" }), signal, cache: "no-store" });
  if (!r.ok || !r.body) throw new ApiError(r.status, "stream refused");
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) {
        let parsed;
        try { parsed = JSON.parse(data.join("\n")); } catch { continue; }
        onEvent(name, parsed);
      } else {
        onEvent("keepalive", null);
      }
    }
  }
}
