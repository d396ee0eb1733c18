// Heatmap groups: when the selection has more GPU cells than the page has room for (10,000
// nodes x 8 GPUs on one screen), the /heatmap answer folds nodes into one group per rack or
// model, and each group is one tile here: filled with the group's figure (mean utilization,
// hottest GPU, worst health, ...), framed by its worst node, so a failing node still shows.

import { esc, num, words, HEALTH } from "./util.js";

// most serious first: the frame of a group with nodes out takes the colour of the worst
const OUT_ORDER = ["failed", "lost", "repair", "drained", "draining"];

/** The figure a group's tile is coloured by: ``agg`` of its GPUs (worst health for health). */
export function groupValue(grp, metric, agg) {
  if (metric === "health") return grp.worst_health;
  return agg === "max" ? grp.max : agg === "min" ? grp.min : grp.mean;
}

/** Square tiles, as large as lets every group fit within ``target`` px of height (56 down to
 * 16 px; below that the canvas grows). */
export function layoutGroups(groups, width, target) {
  const gap = 3;
  let s = 56, perRow = 1, rows = 1;
  for (; s >= 16; s -= 2) {
    perRow = Math.max(1, Math.floor((width + gap) / (s + gap)));
    rows = Math.ceil(groups.length / perRow);
    if (rows * (s + gap) <= target) break;
  }
  s = Math.max(16, s);
  const tiles = groups.map((g, k) => ({
    g, key: g.key, x: (k % perRow) * (s + gap), y: Math.floor(k / perRow) * (s + gap), w: s, h: s,
  }));
  return { tiles, height: Math.max(1, rows) * (s + gap), s };
}

/** Draw group tiles on the 2D context ``g``; ``expanded``: keys whose nodes are shown below. */
export function drawGroups(g, G, { metric, agg, colorFor, healthColors, stateColors, expanded }) {
  const named = G.s >= 30;
  for (const t of G.tiles) {
    const grp = t.g;
    g.fillStyle = "#171b21";
    g.fillRect(t.x, t.y, t.w, t.h);
    g.globalAlpha = grp.out >= grp.nodes ? 0.55 : 1;
    g.fillStyle = colorFor(metric, groupValue(grp, metric, agg));
    g.fillRect(t.x + 2, t.y + 2, t.w - 4, t.h - 4);
    g.globalAlpha = 1;
    let frame = null, lw = 1;
    const worstOut = OUT_ORDER.find((s) => grp.by_state[s]);
    if (grp.by_health.fail) { frame = healthColors[2]; lw = 2; }
    else if (worstOut) { frame = stateColors[worstOut]; lw = 2; }
    else if (grp.by_health.warn) frame = healthColors[1];
    else if (grp.cordoned) frame = "#c9d1d9";
    if (frame) {
      g.strokeStyle = frame;
      g.lineWidth = lw;
      g.strokeRect(t.x + lw / 2, t.y + lw / 2, t.w - lw, t.h - lw);
    }
    if (expanded.has(t.key ?? "")) {
      g.strokeStyle = "#ffffff";
      g.lineWidth = 1;
      g.setLineDash([3, 2]);
      g.strokeRect(t.x + 0.5, t.y + 0.5, t.w - 1, t.h - 1);
      g.setLineDash([]);
    }
    if (named) {
      g.fillStyle = "rgba(11,14,18,0.72)";
      g.fillRect(t.x + 2, t.y + 2, t.w - 4, 12);
      g.fillStyle = grp.by_health.fail ? healthColors[2] : "#d5dde6";
      const label = t.key ?? "none";
      const fit = Math.max(2, Math.floor((t.w - 5) / 6));
      g.fillText(label.length > fit ? `…${label.slice(-(fit - 1))}` : label, t.x + 3, t.y + 3, t.w - 5);
    }
  }
}

/** The tooltip of one group, as HTML (values escaped). */
export function groupTip(grp, by, metric, m, isExpanded) {
  const states = Object.entries(grp.by_state).filter(([, c]) => c).sort((a, b) => b[1] - a[1])
    .map(([s, c]) => `${esc(words(s))} ${c}`).join(" · ");
  const health = HEALTH.map((h) => [h, grp.by_health[h] || 0]).filter(([, c]) => c)
    .map(([h, c]) => `${esc(h)} ${c}`).join(" · ");
  const fig = metric === "health"
    ? `worst health <b>${esc(HEALTH[grp.worst_health] ?? grp.worst_health)}</b>`
    : `${esc(m.label.toLowerCase())} min ${esc(num(grp.min, m.digits))} · mean <b>${esc(num(grp.mean, m.digits))}</b> · max <b>${esc(num(grp.max, m.digits))}</b> ${esc(m.unit)}`;
  const nodata = grp.no_data ? `<div>${grp.no_data} GPU cells without data</div>` : "";
  const out = grp.out ? ` · <b>${grp.out} out</b>` : "";
  return `<div class="tip-h">${esc(by)} ${esc(grp.key ?? "none")}</div><div>${grp.nodes} nodes · ${grp.gpus} GPUs${out}</div>`
    + `<div>${states}</div><div>health: ${health}</div><div>${fig}</div>${nodata}`
    + `<div class="muted">click to ${isExpanded ? "collapse" : "show its nodes"}</div>`;
}
