"""A sweep as JSON and as an HTML page (perf and perf/W against the power limit)."""

from __future__ import annotations

from html import escape
from typing import Any

from gpufleet import svgchart
from gpufleet.energy.advise import Advice
from gpufleet.energy.sweep import SweepPoint, SweepResult


def _point(p: SweepPoint, unit: str) -> dict[str, Any]:
    per_w = None if p.power_w in (None, 0) else p.throughput / p.power_w
    return {
        "limit_w": p.limit_w,
        "seconds": round(p.seconds, 3),
        "throughput": round(p.throughput, 3),
        "unit": unit,
        "energy_j": None if p.energy_j is None else round(p.energy_j, 1),
        "energy_method": p.energy_method,
        "power_w": None if p.power_w is None else round(p.power_w, 1),
        "throughput_per_w": None if per_w is None else round(per_w, 4),
    }


def to_json(result: SweepResult, advice: Advice | None, workload: str) -> dict[str, Any]:
    """The sweep's JSON document (``gpufleet power sweep --json``)."""
    out: dict[str, Any] = {
        "workload": workload,
        "unit": result.unit,
        "gpus": list(result.gpus),
        "original_limits_w": {str(g): w for g, w in result.original_limits_w.items()},
        "restored": result.restored,
        "points": [_point(p, result.unit) for p in result.points],
        "recommendation": None,
    }
    if advice is not None:
        out["recommendation"] = {
            "max_slowdown": advice.max_slowdown,
            "limit_w": advice.within_budget.limit_w,
            "slowdown": round(advice.slowdown, 4),
            "energy_saved": None if advice.energy_saved is None else round(advice.energy_saved, 4),
            "baseline_limit_w": advice.baseline.limit_w,
            "edp_limit_w": advice.edp.limit_w,
        }
    return out


def to_html(result: SweepResult, advice: Advice | None, workload: str) -> str:
    """A self-contained page: throughput and throughput per watt against the limit."""
    pts = [p for p in result.points if p.limit_w is not None]
    xs = [float(p.limit_w or 0) for p in pts]
    perf = svgchart.line_chart(
        f"{workload}: throughput vs power limit",
        [svgchart.Series(result.unit, xs, [p.throughput for p in pts])],
        x_label="power limit (W)",
        y_label=result.unit,
        markers=[(float(advice.within_budget.limit_w), "recommended")]
        if advice and advice.within_budget.limit_w
        else (),
    )
    per_w = svgchart.line_chart(
        f"{workload}: throughput per watt vs power limit",
        [
            svgchart.Series(
                f"{result.unit} per W",
                xs,
                [None if not p.power_w else p.throughput / p.power_w for p in pts],
            )
        ],
        x_label="power limit (W)",
        y_label=f"{result.unit}/W",
    )
    rec = ""
    if advice is not None:
        saved = advice.energy_saved
        rec = (
            f"<p>Recommended: {advice.within_budget.limit_w} W "
            f"(slowdown {advice.slowdown:.1%} within {advice.max_slowdown:.0%}"
            + (f", energy saved {saved:.1%}" if saved is not None else "")
            + f"); energy-delay optimum {advice.edp.limit_w} W.</p>"
        )
    rows = "".join(
        f"<tr><td>{p.limit_w}</td><td>{p.throughput:.1f}</td><td>{p.power_w or 0:.0f}</td></tr>"
        for p in result.points
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>gpufleet power sweep: {escape(workload)}</title></head><body>"
        f"<h1>Power sweep: {escape(workload)}</h1>{rec}{perf}{per_w}"
        f"<table><tr><th>limit W</th><th>{escape(result.unit)}</th><th>power W</th></tr>"
        f"{rows}</table></body></html>"
    )
