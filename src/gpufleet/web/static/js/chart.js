// Hand-written SVG line charts: one chart per metric, one line per GPU, optional dashed
// reference lines (power limit, slowdown temperature, max clock).
import { esc, ts } from "./util.js";

// Tableau 10 (Tableau's default categorical palette), one colour per GPU index.
export const GPU_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
export const gpuColor = (i) => GPU_COLORS[i % GPU_COLORS.length];

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function hhmm(s) {
  return ts(s).slice(11, 16);
}

/**
 * SVG markup of a line chart.
 * series: [{gpu, t: [s...], v: [number|null...]}]; refs: [{value, label, color}]
 */
export function lineChart({ title, unit, series, refs = [], yMin = 0, yMax = null, width = 460, height = 170, focus = null }) {
  const m = { l: 44, r: 10, t: 20, b: 20 };
  const w = Math.max(200, width), h = height;
  const iw = w - m.l - m.r, ih = h - m.t - m.b;
  let t0 = Infinity, t1 = -Infinity, vmax = yMax ?? -Infinity;
  for (const s of series) {
    if (s.t.length) { t0 = Math.min(t0, s.t[0]); t1 = Math.max(t1, s.t[s.t.length - 1]); }
    if (yMax === null) for (const v of s.v) if (v !== null && v > vmax) vmax = v;
  }
  if (yMax === null) for (const r of refs) if (r.value !== null && r.value !== undefined) vmax = Math.max(vmax, r.value);
  const hasData = Number.isFinite(t0) && t1 >= t0;
  const top = yMax ?? niceMax(vmax * 1.05);
  if (!(t1 > t0)) { t0 = (hasData ? t0 : 0) - 60; t1 = hasData ? t1 : 1; }
  const X = (t) => m.l + ((t - t0) / (t1 - t0)) * iw;
  const Y = (v) => m.t + ih - ((v - yMin) / (top - yMin)) * ih;
  const parts = [`<svg class="chart" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="${esc(title)}">`];
  parts.push(`<text class="ct" x="${m.l}" y="13">${esc(title)}${unit ? ` (${esc(unit)})` : ""}</text>`);
  for (let k = 0; k <= 4; k++) {
    const v = yMin + ((top - yMin) * k) / 4;
    const y = Y(v).toFixed(1);
    parts.push(`<line class="gl" x1="${m.l}" x2="${w - m.r}" y1="${y}" y2="${y}"/><text class="yl" x="${m.l - 4}" y="${y}" dy="3">${Math.round(v)}</text>`);
  }
  if (hasData) {
    for (let k = 0; k <= 3; k++) {
      const t = t0 + ((t1 - t0) * k) / 3;
      parts.push(`<text class="xl" x="${X(t).toFixed(1)}" y="${h - 5}" text-anchor="${k === 0 ? "start" : k === 3 ? "end" : "middle"}">${hhmm(t)}</text>`);
    }
  } else {
    parts.push(`<text class="nodata" x="${m.l + iw / 2}" y="${m.t + ih / 2}" text-anchor="middle">no samples</text>`);
  }
  for (const r of refs) {
    if (r.value === null || r.value === undefined) continue;
    const y = Y(r.value).toFixed(1);
    parts.push(`<line class="ref" x1="${m.l}" x2="${w - m.r}" y1="${y}" y2="${y}" stroke="${r.color || "#e5383b"}"/><text class="rl" x="${w - m.r}" y="${y}" dy="-3" text-anchor="end" fill="${r.color || "#e5383b"}">${esc(r.label)}</text>`);
  }
  for (const s of series) {
    let d = "";
    let pen = false;
    for (let k = 0; k < s.t.length; k++) {
      const v = s.v[k];
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(s.t[k]).toFixed(1)} ${Y(Math.min(top, Math.max(yMin, v))).toFixed(1)}`;
      pen = true;
    }
    const dim = focus !== null && focus !== s.gpu;
    parts.push(`<path class="ln${dim ? " dim" : ""}" data-gpu="${s.gpu}" d="${d}" stroke="${gpuColor(s.gpu)}"/>`);
  }
  parts.push("</svg>");
  return parts.join("");
}
