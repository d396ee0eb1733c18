// The fleet heatmap: one tile per node (its GPUs as cells), racks as blocks, drawn on one
// <canvas> so 1,000 nodes x 8 GPUs cost 8,000 fillRect calls and no DOM.

import { esc, num, words, HEALTH, OUT_STATES } from "./util.js";

// Viridis (perceptually uniform, colour-blind safe): matplotlib's default colormap,
// stops from "A Better Default Colormap for Matplotlib" (van der Walt & Smith, SciPy 2015).
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
// Temperature: blue -> yellow -> red (ColorBrewer RdYlBu reversed, colorbrewer2.org).
const RDYLBU = [[49, 54, 149], [116, 173, 209], [254, 224, 144], [244, 109, 67], [165, 0, 38]];
export const HEALTH_COLORS = ["#2f9e55", "#e3a21a", "#e5383b", "#6c757d"];
const NULL_COLOR = "#2b3038";
const STATE_COLORS = {
  registering: "#8fa3b8", validating: "#4aa3df", in_service: "#2f9e55", draining: "#f08c00",
  drained: "#c77d00", repair: "#b565d9", lost: "#9aa0a6", failed: "#e5383b",
};

/**
 * Metrics the picker offers. Ranges: utilization and power as % (of 100 / of the enforced
 * limit); temperature 25-90 C (H100 SXM slowdown is 87 C, the simulator's device info);
 * SM clock 0-2000 MHz (H100 SXM max 1980 MHz, NVIDIA H100 datasheet).
 */
export const METRICS = {
  gpu_util_pct: { label: "Utilization", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0 },
  gpu_temp_c: { label: "Temperature", unit: "°C", min: 25, max: 90, scale: RDYLBU, digits: 0 },
  power_pct: { label: "Power (% of limit)", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0 },
  health: { label: "Health", unit: "", min: 0, max: 3, scale: null, digits: 0 },
  sm_clock_mhz: { label: "SM clock", unit: "MHz", min: 0, max: 2000, scale: VIRIDIS, digits: 0 },
  mem_util_pct: { label: "Memory util", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0 },
};

function lerpScale(stops, t) {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const a = stops[i], b = stops[i + 1];
  return `rgb(${Math.round(a[0] + (b[0] - a[0]) * f)},${Math.round(a[1] + (b[1] - a[1]) * f)},${Math.round(a[2] + (b[2] - a[2]) * f)})`;
}

/** The fill colour of one value of ``metric`` (null/undefined: no data). */
export function colorFor(metric, v) {
  if (v === null || v === undefined || Number.isNaN(v)) return NULL_COLOR;
  const m = METRICS[metric];
  if (!m || !m.scale) return HEALTH_COLORS[Math.max(0, Math.min(3, Math.round(v)))];
  return lerpScale(m.scale, (v - m.min) / (m.max - m.min));
}

/** A gradient legend as an inline HTML string. */
export function legendHtml(metric) {
  const m = METRICS[metric];
  if (!m.scale) {
    return HEALTH.map((h, i) => `<span class="lg"><i style="background:${HEALTH_COLORS[i]}"></i>${h}</span>`).join("")
      + `<span class="lg"><i style="background:${NULL_COLOR}"></i>no data</span>`;
  }
  const stops = m.scale.map((c, i) => `rgb(${c}) ${(100 * i) / (m.scale.length - 1)}%`).join(",");
  return `<span class="lg-num">${m.min}${esc(m.unit)}</span><span class="lg-bar" style="background:linear-gradient(90deg,${stops})"></span><span class="lg-num">${m.max}${esc(m.unit)}</span>`
    + `<span class="lg"><i style="background:${NULL_COLOR}"></i>no data</span>`;
}

export class Heatmap {
  constructor(host, { onClick } = {}) {
    this.host = host;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "heatmap";
    this.tip = document.createElement("div");
    this.tip.className = "tip";
    this.tip.hidden = true;
    host.append(this.canvas, this.tip);
    this.tiles = [];
    this.data = null;
    this.onClick = onClick;
    this.canvas.addEventListener("mousemove", (e) => this._hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.canvas.addEventListener("click", (e) => {
      const hit = this._hit(e);
      if (hit && this.onClick) this.onClick(hit.tile.name, hit.gpu);
    });
  }

  /** Shelf layout of rack blocks at cell size ``c``; returns height and tiles. */
  _layout(groups, maxG, width, c) {
    const cols = maxG <= 4 ? Math.max(1, maxG) : Math.ceil(maxG / 2);
    const rows = Math.ceil(Math.max(1, maxG) / cols);
    const pitch = c + 1;
    const pad = 2;
    const named = c >= 12;
    const tw = cols * pitch - 1 + 2 * pad;
    const th = rows * pitch - 1 + 2 * pad + (named ? 12 : 0);
    const gapX = 3, gapY = 3, blockGap = 12, labelH = 14;
    const tiles = [];
    const labels = [];
    let x = 0, y = 0, shelfH = 0;
    const perRowMax = Math.max(1, Math.floor((width + gapX) / (tw + gapX)));
    for (const g of groups) {
      const n = g.idx.length;
      const k = Math.min(n, perRowMax, Math.max(4, Math.ceil(Math.sqrt(n * 2))));
      const bw = k * (tw + gapX) - gapX;
      const bh = labelH + Math.ceil(n / k) * (th + gapY) - gapY;
      if (x > 0 && x + bw > width) { x = 0; y += shelfH + blockGap; shelfH = 0; }
      labels.push({ text: g.rack, x, y, n });
      g.idx.forEach((i, j) => {
        tiles.push({ i, x: x + (j % k) * (tw + gapX), y: y + labelH + Math.floor(j / k) * (th + gapY), w: tw, h: th });
      });
      x += bw + blockGap * 2;
      shelfH = Math.max(shelfH, bh);
    }
    return { height: y + shelfH + 2, tiles, labels, cols, pitch, pad, c, named, th };
  }

  /** Draw heatmap data (the /heatmap answer) for ``metric``; ``extra`` maps node -> {cordoned}. */
  draw(data, metric, extra = {}) {
    this.data = data;
    this.metric = metric;
    const width = Math.max(320, this.host.clientWidth - 4);
    const n = data.nodes.length;
    const maxG = data.values.reduce((a, r) => Math.max(a, r.length), 1);
    const byRack = new Map();
    for (let i = 0; i < n; i++) {
      const r = data.racks[i] || "no rack";
      if (!byRack.has(r)) byRack.set(r, []);
      byRack.get(r).push(i);
    }
    const groups = [...byRack.entries()].sort((a, b) => (a[0] === "no rack") - (b[0] === "no rack") || a[0].localeCompare(b[0])).map(([rack, idx]) => ({ rack, idx }));
    const target = Math.max(360, window.innerHeight - this.host.getBoundingClientRect().top - 24);
    let L = null;
    for (let c = 22; c >= 5; c--) {
      L = this._layout(groups, maxG, width, c);
      if (L.height <= target) break;
    }
    this.L = L;
    const dpr = window.devicePixelRatio || 1;
    const cv = this.canvas;
    cv.width = Math.round(width * dpr);
    cv.height = Math.round(L.height * dpr);
    cv.style.width = `${width}px`;
    cv.style.height = `${L.height}px`;
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, L.height);
    g.font = "10px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
    g.textBaseline = "top";
    for (const lb of L.labels) {
      g.fillStyle = "#8b96a3";
      g.fillText(`${lb.text} · ${lb.n}`, lb.x, lb.y + 1);
    }
    this.tiles = [];
    const { pitch, pad, c, cols } = L;
    for (const t of L.tiles) {
      const i = t.i;
      const name = data.nodes[i];
      const state = data.states[i];
      // a lost node's last reported health is history: unknown now
      const health = state === "lost" ? 3 : data.health[i];
      const row = data.values[i];
      const out = OUT_STATES.has(state);
      // tile background + frame: red for fail, amber for warn, the state's colour when out
      g.fillStyle = "#171b21";
      g.fillRect(t.x, t.y, t.w, t.h);
      let frame = null, lw = 1;
      if (health === 2) { frame = HEALTH_COLORS[2]; lw = 2; }
      else if (out) { frame = STATE_COLORS[state]; lw = 2; }
      else if (health === 1) frame = HEALTH_COLORS[1];
      else if (extra[name] && extra[name].cordoned) frame = "#c9d1d9";
      g.globalAlpha = out && health !== 2 ? 0.55 : 1;
      for (let j = 0; j < row.length; j++) {
        g.fillStyle = colorFor(metric, row[j]);
        g.fillRect(t.x + pad + (j % cols) * pitch, t.y + pad + Math.floor(j / cols) * pitch, c, c);
      }
      g.globalAlpha = 1;
      if (frame) {
        g.strokeStyle = frame;
        g.lineWidth = lw;
        g.strokeRect(t.x + lw / 2, t.y + lw / 2, t.w - lw, t.h - lw);
      }
      if (L.named) {
        g.fillStyle = health === 2 ? HEALTH_COLORS[2] : "#aeb8c4";
        g.fillText(name.length > 10 ? `…${name.slice(-9)}` : name, t.x + 2, t.y + t.h - 11, t.w - 3);
      }
      this.tiles.push({ ...t, name, state, health });
    }
    this.byName = new Map(this.tiles.map((t) => [t.name, t]));
  }

  /** Centre of GPU ``gpu``'s cell of node ``name`` in CSS pixels (tests sample it). */
  cellCenter(name, gpu = 0) {
    const t = this.byName && this.byName.get(name);
    if (!t) return null;
    const { pitch, pad, c, cols } = this.L;
    return { x: t.x + pad + (gpu % cols) * pitch + c / 2, y: t.y + pad + Math.floor(gpu / cols) * pitch + c / 2 };
  }

  _hit(e) {
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    for (const t of this.tiles) {
      if (x >= t.x && x < t.x + t.w && y >= t.y && y < t.y + t.h) {
        const { pitch, pad, cols } = this.L;
        const cx = Math.floor((x - t.x - pad) / pitch), cy = Math.floor((y - t.y - pad) / pitch);
        const gpu = cx >= 0 && cx < cols && cy >= 0 ? cy * cols + cx : null;
        const width = this.data.values[t.i].length;
        return { tile: t, gpu: gpu !== null && gpu < width ? gpu : null };
      }
    }
    return null;
  }

  _hover(e) {
    const hit = this._hit(e);
    if (!hit) { this.tip.hidden = true; this.canvas.style.cursor = ""; return; }
    this.canvas.style.cursor = "pointer";
    const t = hit.tile;
    const m = METRICS[this.metric];
    let line = "";
    if (hit.gpu !== null) {
      const v = this.data.values[t.i][hit.gpu];
      const shown = this.metric === "health" ? (v === null ? "N/A" : HEALTH[v]) : `${num(v, m.digits)}${v === null ? "" : ` ${m.unit}`}`;
      line = `<div>GPU ${hit.gpu}: <b>${esc(shown)}</b> ${esc(m.label.toLowerCase())}</div>`;
    }
    this.tip.innerHTML = `<div class="tip-h">${esc(t.name)}</div><div>${esc(this.data.racks[t.i] || "no rack")} · ${esc(this.data.models[t.i] || "")}</div>`
      + `<div>${esc(words(t.state))} · health ${esc(HEALTH[t.health] ?? t.health)}</div>${line}`;
    this.tip.hidden = false;
    const r = this.host.getBoundingClientRect();
    const x = e.clientX - r.left + 14, y = e.clientY - r.top + 14;
    this.tip.style.left = `${Math.min(x, r.width - 220)}px`;
    this.tip.style.top = `${y}px`;
  }
}
