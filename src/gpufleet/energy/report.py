"""A sweep as JSON and as an HTML page (perf and perf/W against the power limit and the locked
SM clock, and the knob that saves more)."""

from __future__ import annotations

from html import escape
from typing import Any

from gpufleet import svgchart
from gpufleet.energy import knobs
from gpufleet.energy.advise import Advice, compare_knobs
from gpufleet.energy.clocks import ClockPoint
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


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:1.5rem auto;color:#222}"
    "table{border-collapse:collapse;margin:.8rem 0}td,th{padding:.2rem .7rem;text-align:right;"
    "border-bottom:1px solid #ddd}.modelled{color:#7a4b00}"
)


def _na(v: float | None, fmt: str) -> str:
    return "N/A" if v is None else format(v, fmt)


def _table(key: str, head: str, unit: str, rows: list[tuple[str, dict[str, Any]]]) -> str:
    """One row per swept setting, from the JSON document's points (the CLI table's figures);
    an unknown power or energy is N/A, never 0."""
    body = "".join(
        f"<tr><td>{escape(label)}</td><td>{p['throughput']:.1f}</td>"
        f"<td>{_na(p['power_w'], '.0f')}</td><td>{_na(p['throughput_per_w'], '.3f')}</td>"
        f"<td>{escape(p['energy_method'] or 'N/A')}</td></tr>"
        for label, p in rows
    )
    u = escape(unit)
    return (
        f"<table id='{key}'><tr><th>{head}</th><th>{u}</th><th>power W</th><th>{u}/W</th>"
        f"<th>energy</th></tr>{body}</table>"
    )


def _charts(
    title: str, unit: str, xs: list[float], pts: list[SweepPoint], x_label: str, mark: float | None
) -> str:
    perf = svgchart.line_chart(
        f"{title}: throughput vs {x_label}",
        [svgchart.Series(unit, xs, [p.throughput for p in pts])],
        x_label=x_label,
        y_label=unit,
        markers=[(mark, "recommended")] if mark else (),
    )
    per_w = svgchart.line_chart(
        f"{title}: throughput per watt vs {x_label}",
        [
            svgchart.Series(
                f"{unit} per W",
                xs,
                [None if not p.power_w else p.throughput / p.power_w for p in pts],
            )
        ],
        x_label=x_label,
        y_label=f"{unit}/W",
    )
    return perf + per_w


def _recommended(advice: Advice | None, what: str) -> str:
    if advice is None:
        return f"<p>No {what} recommendation: energy unknown (no counter, no power readings).</p>"
    saved = advice.energy_saved
    return (
        f"<p class='recommended'>Recommended {what}: {escape(knobs.setting(advice.within_budget))}"
        f" (slowdown {advice.slowdown:.1%} within {advice.max_slowdown:.0%}"
        + (f", energy saved {saved:.1%}" if saved is not None else "")
        + f"); energy-delay optimum {escape(knobs.setting(advice.edp))}.</p>"
    )


def to_html(
    result: SweepResult | None,
    advice: Advice | None,
    workload: str,
    *,
    clocks: tuple[SweepResult, Advice | None] | None = None,
    max_slowdown: float | None = None,
    modelled: bool = False,
) -> str:
    """A self-contained page: throughput and throughput per watt against the power limit and,
    with ``clocks``, against the locked SM clock, then the knob that saves more within the
    budget; every heading says "modelled" when the figures come from the simulator."""
    tag = " (modelled)" if modelled else ""
    w = escape(workload)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>gpufleet power sweep{tag}: {w}</title><style>{_CSS}</style></head><body>",
        f"<h1>Power sweep{tag}: {w}</h1>",
    ]
    if modelled:
        parts.append(
            "<p class='modelled'>Modelled: these figures come from the simulator, not a GPU: "
            f"{escape(knobs.MODEL_SOURCE)}.</p>"
        )
    if result is not None:
        pts = [p for p in result.points if p.limit_w is not None]
        mark = advice.within_budget.limit_w if advice else None
        rows = [
            ("current" if d["limit_w"] is None else f"{d['limit_w']:g}", d)
            for d in (_point(p, result.unit) for p in result.points)
        ]
        parts += [
            f"<h2>Power limit{tag}</h2>",
            _recommended(advice, "power limit"),
            _charts(
                w,
                result.unit,
                [float(p.limit_w or 0) for p in pts],
                pts,
                "power limit (W)",
                None if mark is None else float(mark),
            ),
            _table("limit-sweep", "limit W", result.unit, rows),
        ]
    if clocks is not None:
        cres, cadv = clocks
        cpts = [p for p in cres.points if isinstance(p, ClockPoint) and p.clock_mhz is not None]
        cmark = cadv.within_budget if cadv else None
        parts += [
            f"<h2>Locked SM clock{tag}</h2>",
            _recommended(cadv, "locked clock"),
            _charts(
                w,
                cres.unit,
                [float(p.clock_mhz or 0) for p in cpts],
                list(cpts),
                "SM clock (MHz)",
                float(cmark.clock_mhz)
                if isinstance(cmark, ClockPoint) and cmark.clock_mhz is not None
                else None,
            ),
            _table(
                "clock-sweep",
                "clock MHz",
                cres.unit,
                [(str(d["clock_mhz"]), d) for d in knobs.clock_points_json(cres)],
            ),
        ]
        budget = max_slowdown
        if budget is None:
            budget = next((a.max_slowdown for a in (cadv, advice) if a is not None), None)
        if budget is None:  # neither knob's energy is known: nothing to compare
            lines = ["", "winner: unknown (no energy reading)"]
        else:
            lines = knobs.comparison_lines(compare_knobs(advice, cadv), budget, modelled)
        items = "".join(f"<li>{escape(ln.strip())}</li>" for ln in lines[1:])
        parts.append(
            f"<h2>Which knob saves more{tag}</h2><p>{escape(lines[0])}</p>"
            f"<ul id='knobs'>{items}</ul>"
        )
    parts.append("</body></html>")
    return "".join(parts)
