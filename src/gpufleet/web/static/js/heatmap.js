// The fleet heatmap: one tile per node (its GPUs as cells), racks as blocks, drawn on one
// <canvas> so 1,000 nodes x 8 GPUs cost 8,000 fillRect calls and no DOM. Past what the page
// can show (cellBudget), the server folds nodes into rack or model groups: one tile per group
// (hmgroups.js) on top, the nodes of the groups the user expanded below.

import { esc, num, words, HEALTH, OUT_STATES } from "./util.js";
import { layoutGroups, drawGroups, groupTip } from "./hmgroups.js";

// Page area one GPU cell needs at the smallest drawn size: an 8-GPU tile at 5 px cells is
// 27 x 15 px plus 3 px gaps (30 x 18 = 540 px^2, 67.5 per GPU). More GPUs than the page's
// area over this, and the heatmap asks for groups.
const PX2_PER_GPU = 68;
const EXPANDED_CELL = 12; // expanded groups' nodes: cells large enough to carry names

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
 * Metrics the picker offers; ``agg`` is what colours a group's tile (its hottest GPU, its
 * slowest clock, the mean utilization, the worst health). Ranges: utilization and power as % (of 100 / of the enforced
 * limit); temperature 25-90 C (H100 SXM slowdown is 87 C, the simulator's device info);
 * SM clock 0-2000 MHz (H100 SXM max 1980 MHz, NVIDIA H100 datasheet).
 */
export const METRICS = {
  gpu_util_pct: { label: "Utilization", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0, agg: "mean" },
  gpu_temp_c: { label: "Temperature", unit: "°C", min: 25, max: 90, scale: RDYLBU, digits: 0, agg: "max" },
  power_pct: { label: "Power (% of limit)", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0, agg: "mean" },
  health: { label: "Health", unit: "", min: 0, max: 3, scale: null, digits: 0, agg: "worst" },
  sm_clock_mhz: { label: "SM clock", unit: "MHz", min: 0, max: 2000, scale: VIRIDIS, digits: 0, agg: "min" },
  mem_util_pct: { label: "Memory util", unit: "%", min: 0, max: 100, scale: VIRIDIS, digits: 0, agg: "mean" },
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
  constructor(host, { onClick, onGroup } = {}) {
    this.host = host;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "heatmap";
    this.tip = document.createElement("div");
    this.tip.className = "tip";
    this.tip.hidden = true;
    host.append(this.canvas, this.tip);
    this.tiles = [];
    this.data = null;
    this.groupTiles = [];
    this.onClick = onClick;
    this.onGroup = onGroup;
    this.canvas.addEventListener("mousemove", (e) => this._hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.canvas.addEventListener("click", (e) => {
      const hit = this._hit(e);
      if (hit && hit.group && this.onGroup) this.onGroup(hit.group.key ?? "");
      else if (hit && hit.tile && this.onClick) this.onClick(hit.tile.name, hit.gpu);
    });
  }

  _width() {
    return Math.max(320, this.host.clientWidth - 4);
  }

  _target() {
    return Math.max(360, window.innerHeight - this.host.getBoundingClientRect().top - 24);
  }

  /** How many GPU cells the page has room for: past this, ask the server for groups. */
  cellBudget() {
    return Math.floor((this._width() * this._target()) / PX2_PER_GPU);
  }

  /** Y (CSS px, within the canvas) where the expanded groups' nodes start. */
  get nodesTop() {
    return this.y0 || 0;
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

  /** Draw heatmap data (the /heatmap answer) for ``metric``; ``extra`` maps node -> {cordoned}
   * (older answers without the ``cordoned`` array). With ``data.groups``: group tiles, then the
   * rows of the expanded groups. */
  draw(data, metric, extra = {}) {
    this.data = data;
    this.metric = metric;
    const width = this._width();
    const n = data.nodes.length;
    const maxG = data.values.reduce((a, r) => Math.max(a, r.length), 1);
    const grouped = Array.isArray(data.groups);
    const byModel = grouped && data.group_by === "model";
    const blockOf = (i) => (byModel ? data.models[i] || "no model" : data.racks[i] || "no rack");
    const byBlock = new Map();
    for (let i = 0; i < n; i++) {
      const r = blockOf(i);
      if (!byBlock.has(r)) byBlock.set(r, []);
      byBlock.get(r).push(i);
    }
    const none = byModel ? "no model" : "no rack";
    const blocks = [...byBlock.entries()].sort((a, b) => (a[0] === none) - (b[0] === none) || a[0].localeCompare(b[0])).map(([rack, idx]) => ({ rack, idx }));
    const target = this._target();
    let G = null;
    this.y0 = 0;
    if (grouped) {
      G = layoutGroups(data.groups, width, n ? Math.max(120, target * 0.6) : target);
      this.y0 = G.height + (n ? 14 : 0);
    }
    let L = null;
    if (n || !grouped) {
      for (let c = grouped ? EXPANDED_CELL : 22; c >= 5; c--) {
        L = this._layout(blocks, maxG, width, c);
        if (grouped || L.height <= target) break;
      }
    }
    this.L = L;
    this.G = G;
    const height = this.y0 + (L ? L.height : 0);
    const dpr = window.devicePixelRatio || 1;
    const cv = this.canvas;
    cv.width = Math.round(width * dpr);
    cv.height = Math.round(height * dpr);
    cv.style.width = `${width}px`;
    cv.style.height = `${height}px`;
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    g.font = "10px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
    g.textBaseline = "top";
    this.groupTiles = [];
    if (G) {
      const keyOf = (i) => (byModel ? data.models[i] : data.racks[i]) ?? "";
      const expanded = new Set(data.nodes.map((_, i) => keyOf(i)));
      drawGroups(g, G, {
        metric, agg: (METRICS[metric] || {}).agg, colorFor, healthColors: HEALTH_COLORS, stateColors: STATE_COLORS, expanded,
      });
      this.groupTiles = G.tiles.map((t) => ({ ...t, expanded: expanded.has(t.key ?? "") }));
    }
    this.tiles = [];
    if (L) this._drawNodes(g, data, metric, extra, L, this.y0);
    this.byName = new Map(this.tiles.map((t) => [t.name, t]));
  }

  _drawNodes(g, data, metric, extra, L, y0) {
    for (const lb of L.labels) {
      g.fillStyle = "#8b96a3";
      g.fillText(`${lb.text} · ${lb.n}`, lb.x, y0 + lb.y + 1);
    }
    const { pitch, pad, c, cols } = L;
    for (const t0 of L.tiles) {
      const t = { ...t0, y: t0.y + y0 };
      const i = t.i;
      const name = data.nodes[i];
      const state = data.states[i];
      // a lost node's last reported health is history: unknown now
      const health = state === "lost" ? 3 : data.health[i];
      const row = data.values[i];
      const out = OUT_STATES.has(state);
      const cordoned = data.cordoned ? data.cordoned[i] : extra[name] && extra[name].cordoned;
      // tile background + frame: red for fail, amber for warn, the state's colour when out
      g.fillStyle = "#171b21";
      g.fillRect(t.x, t.y, t.w, t.h);
      let frame = null, lw = 1;
      if (health === 2) { frame = HEALTH_COLORS[2]; lw = 2; }
      else if (out) { frame = STATE_COLORS[state]; lw = 2; }
      else if (health === 1) frame = HEALTH_COLORS[1];
      else if (cordoned) frame = "#c9d1d9";
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
  }

  /** Centre of group ``key``'s tile in CSS pixels (null: no such group shown). */
  groupCenter(key) {
    const t = this.groupTiles.find((x) => (x.key ?? "") === (key ?? ""));
    return t ? { x: t.x + t.w / 2, y: t.y + t.h / 2 } : null;
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
    for (const t of this.groupTiles) {
      if (x >= t.x && x < t.x + t.w && y >= t.y && y < t.y + t.h) return { group: t };
    }
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
    const m = METRICS[this.metric];
    if (hit.group) {
      const by = this.data.group_by === "model" ? "model" : "rack";
      this.tip.innerHTML = groupTip(hit.group.g, by, this.metric, m, hit.group.expanded);
      this._placeTip(e);
      return;
    }
    const t = hit.tile;
    let line = "";
    if (hit.gpu !== null) {
      const v = this.data.values[t.i][hit.gpu];
      const shown = this.metric === "health" ? (v === null ? "N/A" : HEALTH[v]) : `${num(v, m.digits)}${v === null ? "" : ` ${m.unit}`}`;
      line = `<div>GPU ${hit.gpu}: <b>${esc(shown)}</b> ${esc(m.label.toLowerCase())}</div>`;
    }
    this.tip.innerHTML = `<div class="tip-h">${esc(t.name)}</div><div>${esc(this.data.racks[t.i] || "no rack")} · ${esc(this.data.models[t.i] || "")}</div>`
      + `<div>${esc(words(t.state))} · health ${esc(HEALTH[t.health] ?? t.health)}</div>${line}`;
    this._placeTip(e);
  }

  _placeTip(e) {
    this.tip.hidden = false;
    const r = this.host.getBoundingClientRect();
    const x = e.clientX - r.left + 14, y = e.clientY - r.top + 14;
    this.tip.style.left = `${Math.min(x, r.width - 220)}px`;
    this.tip.style.top = `${y}px`;
  }
}
