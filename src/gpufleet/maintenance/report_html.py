"""The campaign plan as a self-contained HTML page: a summary, the capacity timeline against
the floor (inline SVG, no scripts), and the node order."""

from __future__ import annotations

import html
from datetime import datetime

from gpufleet.maintenance.planner import CampaignPlan

W, H, LEFT, BOTTOM, TOP, RIGHT = 860, 300, 64, 46, 16, 16


def _hours(s: float) -> str:
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400 * 2:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _timeline_svg(plan: CampaignPlan, floor: float) -> str:
    pts = plan.timeline
    t0 = plan.start.timestamp()
    span = max(1.0, plan.end.timestamp() - t0)
    lo = max(0.0, min(floor, plan.min_in_service) - 0.05)

    def x(t: datetime) -> float:
        return LEFT + (t.timestamp() - t0) / span * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (1 - (v - lo) / (1 - lo or 1)) * (H - TOP - BOTTOM)

    first = pts[0]
    path = [f"M{x(first.t):.1f},{y(first.in_service):.1f}"]
    for p in pts[1:]:  # a step line: capacity holds until the next change
        path.append(f"H{x(p.t):.1f}V{y(p.in_service):.1f}")
    path.append(f"H{x(plan.end):.1f}")
    ticks = []
    for k in range(5):
        v = lo + (1 - lo) * k / 4
        ticks.append(
            f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v * 100:.0f} %</text>'
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
        )
    for k in range(5):
        ts = t0 + span * k / 4
        label = datetime.fromtimestamp(ts, plan.start.tzinfo).strftime("%a %d %b %H:%M")
        ticks.append(
            f'<text x="{LEFT + (W - LEFT - RIGHT) * k / 4:.1f}" y="{H - BOTTOM + 18}" '
            f'text-anchor="{("start", "middle", "middle", "middle", "end")[k]}">{label} UTC</text>'
        )
    return (
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" '
        'aria-label="in-service GPU capacity over the campaign">'
        + "".join(ticks)
        + f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(floor):.1f}" y2="{y(floor):.1f}" '
        'class="floor"/>'
        + f'<text x="{W - RIGHT}" y="{y(floor) - 5:.1f}" text-anchor="end" class="floorlabel">'
        f"floor {floor * 100:.0f} %</text>"
        + f'<path d="{"".join(path)}" class="cap"/>'
        + f'<text x="{LEFT}" y="{H - 6}" class="axis">time (UTC)</text>'
        + f'<text x="14" y="{TOP + 90}" class="axis" transform="rotate(-90 14 {TOP + 90})">'
        "in-service GPUs</text></svg>"
    )


def render_html(plan: CampaignPlan, floor: float, title: str = "Maintenance campaign") -> str:
    """The whole page."""
    rows = "".join(
        f"<tr><td>{p.order}</td><td>{html.escape(p.name)}</td><td>{html.escape(p.domain)}</td>"
        f"<td>{p.start:%a %Y-%m-%d %H:%M}</td><td>{p.end:%a %Y-%m-%d %H:%M}</td></tr>"
        for p in plan.nodes
    )
    skipped = "".join(
        f"<li>{html.escape(n)}: {html.escape(why)}</li>" for n, why in plan.unplannable
    )
    serial = _hours(plan.serial_s) if plan.serial_s is not None else "n/a"
    summary = (
        f"<li>{len(plan.nodes)} node(s) planned, at most {plan.parallelism} at once</li>"
        f"<li>expected duration {_hours(plan.duration_s)} ({plan.windows_used} window(s)); "
        f"ideal {_hours(plan.ideal_s)}; one node at a time {serial}</li>"
        f"<li>lowest in-service capacity {plan.min_in_service * 100:.1f} % "
        f"(floor {floor * 100:.0f} %)</li>"
    )
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title><style>
body{{font:14px system-ui,sans-serif;margin:24px;max-width:960px}}
svg text{{font-size:11px;fill:#333}} .grid{{stroke:#eee}} .floor{{stroke:#c00;stroke-dasharray:4 3}}
.floorlabel{{fill:#c00}} .cap{{fill:none;stroke:#1565c0;stroke-width:2}} .axis{{fill:#555}}
table{{border-collapse:collapse}}
td,th{{padding:2px 10px;border-bottom:1px solid #eee;text-align:left}}
</style></head><body><h1>{html.escape(title)}</h1><ul>{summary}</ul>
<h2>In-service capacity</h2>{_timeline_svg(plan, floor)}
{f"<h2>Not planned</h2><ul>{skipped}</ul>" if skipped else ""}
<h2>Order</h2><table><thead><tr><th>#</th><th>node</th><th>failure domain</th><th>start (UTC)</th>
<th>end (UTC)</th></tr></thead><tbody>{rows}</tbody></table></body></html>
"""
