"""`power sweep --clocks`: the locked-clock sweep and the knob comparison as JSON and as text.

Figures measured on the simulator come from its DVFS model (`gpufleet.devices.sim.physics`),
not from a GPU: every output that shows them says "modelled".
"""

from __future__ import annotations

from typing import Any

from gpufleet.energy.advise import Advice, KnobComparison
from gpufleet.energy.clocks import ClockPoint
from gpufleet.energy.sweep import SweepResult

MODEL_SOURCE = (
    "simulator DVFS model P = idle + u*i*span*(s + (1-s)*g(f)/g(f0)), g(f) = f*V(f)^2 "
    "(Mei, Wang and Chu, Digital Communications and Networks 2017), fitted to the H200 "
    "fixture (79 W at 345 MHz idle, 691 W at 1470 MHz bf16 under the 700 W cap, 122.7 W at "
    "1980 MHz clocked idle); V(f) shape assumed"
)
KNOB_LABEL = {"power_limit": "power limit", "locked_clock": "locked clock"}


def _r(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def clock_points_json(result: SweepResult) -> list[dict[str, Any]]:
    """One row per locked clock."""
    rows = []
    for p in result.points:
        per_w = None if p.power_w in (None, 0) else p.throughput / (p.power_w or 1)
        rows.append(
            {
                "clock_mhz": p.clock_mhz if isinstance(p, ClockPoint) else None,
                "limit_w": p.limit_w,
                "seconds": round(p.seconds, 3),
                "throughput": round(p.throughput, 3),
                "unit": result.unit,
                "energy_j": _r(p.energy_j, 1),
                "energy_method": p.energy_method,
                "power_w": _r(p.power_w, 1),
                "throughput_per_w": _r(per_w, 4),
            }
        )
    return rows


def setting(point: Any) -> str:
    """``1020 MHz`` for a locked clock's point, ``400 W`` for a power limit's."""
    if isinstance(point, ClockPoint):
        return f"{point.clock_mhz} MHz"
    return "current limit" if point.limit_w is None else f"{point.limit_w:g} W"


def advice_json(advice: Advice | None) -> dict[str, Any] | None:
    """A knob's recommendation: its setting, slowdown and saving against its fastest point."""
    if advice is None:
        return None
    rec, base, edp = advice.within_budget, advice.baseline, advice.edp
    clock = isinstance(rec, ClockPoint)
    return {
        "setting": setting(rec),
        "clock_mhz": rec.clock_mhz if isinstance(rec, ClockPoint) else None,
        "limit_w": None if clock else rec.limit_w,
        "slowdown": round(advice.slowdown, 4),
        "energy_saved": _r(advice.energy_saved, 4),
        "baseline": setting(base),
        "edp_optimum": setting(edp),
    }


def clocks_json(result: SweepResult, advice: Advice | None) -> dict[str, Any]:
    """The ``clock_sweep`` section of ``power sweep --json``."""
    return {
        "points": clock_points_json(result),
        "restored": result.restored,
        "recommendation": advice_json(advice),
    }


def comparison_json(cmp: KnobComparison, max_slowdown: float) -> dict[str, Any]:
    """The ``knobs`` section: both knobs at the same budget and the winner."""
    return {
        "max_slowdown": max_slowdown,
        "power_limit": advice_json(cmp.power_limit),
        "locked_clock": advice_json(cmp.locked_clock),
        "winner": cmp.winner,
        "margin": _r(cmp.margin, 4),
    }


def comparison_lines(cmp: KnobComparison, max_slowdown: float, modelled: bool) -> list[str]:
    """The text summary: each knob's best setting within the budget, then the winner."""
    tag = " (modelled)" if modelled else ""
    out = [f"at <= {max_slowdown:.0%} slowdown{tag}:"]
    for knob, adv in (("power_limit", cmp.power_limit), ("locked_clock", cmp.locked_clock)):
        if adv is None:
            out.append(f"  {KNOB_LABEL[knob]:<12} not swept or energy unknown")
            continue
        saved = adv.energy_saved
        out.append(
            f"  {KNOB_LABEL[knob]:<12} {setting(adv.within_budget):>9}: slowdown "
            f"{adv.slowdown:.1%}, energy/work "
            f"{'unknown' if saved is None else f'-{saved:.1%}'} vs {setting(adv.baseline)}"
        )
    if cmp.winner is None:
        out.append("  winner: unknown (no energy reading)")
    else:
        margin = cmp.margin
        by = "" if margin is None else f" by {margin * 100:.1f} points"
        out.append(f"  winner: {KNOB_LABEL[cmp.winner]}{by}")
    return out
