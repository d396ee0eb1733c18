"""Which limit to recommend from a sweep: the least energy per unit of work within a slowdown
budget (as Zeus's MaxSlowdownConstraint selector does, ml.energy/zeus power limit optimizer),
and the energy-delay optimum (least energy x time per unit of work)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.energy.sweep import SweepPoint, SweepResult
from gpufleet.errors import UsageError


@dataclass(frozen=True)
class Advice:
    """The baseline (fastest point), the recommendation within the budget, the EDP optimum."""

    baseline: SweepPoint
    within_budget: SweepPoint
    edp: SweepPoint
    max_slowdown: float

    @property
    def slowdown(self) -> float:
        return 1.0 - self.within_budget.throughput / self.baseline.throughput

    @property
    def energy_saved(self) -> float | None:
        a, b = self.baseline.energy_per_work, self.within_budget.energy_per_work
        return None if a is None or b is None or a <= 0 else 1.0 - b / a


def parse_slowdown(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError as exc:
        raise UsageError(f"--max-slowdown: {text!r} is not a percentage (e.g. 5%)") from exc
    if not 0 <= v < 1:
        raise UsageError(f"--max-slowdown: {text!r} must be between 0 and 100 %")
    return v


def advise(result: SweepResult, max_slowdown: float) -> Advice | None:
    """None when no point has a known energy."""
    pts = [p for p in result.points if p.energy_per_work is not None and p.throughput > 0]
    if not pts:
        return None
    base = max(pts, key=lambda p: p.throughput)
    ok = [p for p in pts if p.throughput >= base.throughput * (1.0 - max_slowdown) - 1e-12]
    best = min(ok, key=lambda p: p.energy_per_work or 0.0)
    edp = min(pts, key=lambda p: (p.energy_per_work or 0.0) / p.throughput)
    return Advice(base, best, edp, max_slowdown)


KNOBS = ("power_limit", "locked_clock")


@dataclass(frozen=True)
class KnobComparison:
    """Each knob's advice at the same slowdown budget and the one that saves more energy per
    unit of work (None: neither's saving is known)."""

    power_limit: Advice | None
    locked_clock: Advice | None
    winner: str | None  # "power_limit" or "locked_clock"

    @property
    def margin(self) -> float | None:
        """The winner's saving minus the other's (fractions of the baseline's energy/work)."""
        a = self.power_limit.energy_saved if self.power_limit else None
        b = self.locked_clock.energy_saved if self.locked_clock else None
        return None if a is None or b is None else abs(a - b)


def compare_knobs(power_limit: Advice | None, locked_clock: Advice | None) -> KnobComparison:
    """The knob whose recommendation saves more; a tie goes to the power limit (it needs no
    clock lock that must be undone)."""
    a = power_limit.energy_saved if power_limit else None
    b = locked_clock.energy_saved if locked_clock else None
    if a is None and b is None:
        winner = None
    elif b is None or (a is not None and a >= b):
        winner = "power_limit"
    else:
        winner = "locked_clock"
    return KnobComparison(power_limit, locked_clock, winner)
