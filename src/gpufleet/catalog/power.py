"""Throughput and power of a GPU against its power limit: the one model the simulator, the
power advisor's benchmarks and the planner's power-capped scenario share.

A load's power at SM clock ratio ``r`` (clock / max clock) and utilization ``u`` is
``idle + u * intensity * span * (static + (1 - static) * (r / r0)^2)`` with ``span`` the model's
max power minus idle and ``r0`` the clock ratio a bf16 matmul settles at under the default limit
(the H200 fixture: 1470 of 1980 MHz at 700 W). The ``static`` share (HBM, L2, NVLink) does not
follow the SM clock; the rest is dynamic power, quadratic in the clock as in the simulator's
physics. When the load would draw more than the limit the clock falls until it fits. Throughput
relative to the max clock is ``1 - clock_sensitivity * (1 - r)``: compute-bound work loses most
of the clock it loses, memory-bound work little. Figures and sources: ``data/power.yaml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from gpufleet.catalog import performance as perf
from gpufleet.catalog.loader import load_catalog
from gpufleet.catalog.models import GpuModel
from gpufleet.errors import UnknownNameError

CAP_HOLD_RATIO = 0.987  # H200 fixture: 691 W average under the 700 W cap
MIN_CLOCK_RATIO = 345 / 1980  # H200 fixture: idle SM clock
IDLE_FRACTION = 0.113  # H200 fixture: 79 W idle of 700 W, for models without a measured idle


@dataclass(frozen=True)
class Profile:
    """How one kind of work draws power and how its speed follows the SM clock."""

    name: str
    unit: str
    intensity: float
    static: float
    clock_sensitivity: float
    source: str

    def relative_throughput(self, clock_ratio: float) -> float:
        """Throughput at a clock ratio relative to the max clock's."""
        r = max(0.0, min(1.0, clock_ratio))
        return 1.0 - self.clock_sensitivity * (1.0 - r)


@dataclass(frozen=True)
class PublishedPoint:
    """A published measurement of a power cap's effect (throughput or energy ratio)."""

    id: str
    gpu: str
    workload: str
    from_w: float
    to_w: float
    metric: str  # "throughput" or "energy": value at to_w relative to from_w
    value: float
    source: str


@dataclass(frozen=True)
class OperatingPoint:
    """Where a GPU settles under a limit running a load."""

    limit_w: float
    clock_ratio: float
    power_w: float
    capped: bool
    relative_throughput: float  # relative to the max clock

    @property
    def energy_per_work(self) -> float:
        """Joules per unit of work (relative units: power / relative throughput)."""
        return self.power_w / self.relative_throughput if self.relative_throughput else math.inf


@cache
def _data() -> dict[str, Any]:
    text = resources.files("gpufleet.catalog").joinpath("data/power.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


@cache
def profiles() -> dict[str, Profile]:
    """Every workload profile by name (``matmul-bf16``, ``hbm``, ``llm-inference``)."""
    out: dict[str, Profile] = {}
    for name, d in _data()["workloads"].items():
        sens = d.get("clock_sensitivity")
        out[name] = Profile(
            name=name,
            unit=str(d["unit"]),
            intensity=float(d["intensity"]),
            static=float(d["static"]),
            clock_sensitivity=float(sens) if sens is not None else perf.clock_sensitivity(),
            source=" ".join(str(d["source"]).split()),
        )
    return out


def profile(name: str) -> Profile:
    """One workload profile; UnknownNameError lists the known ones."""
    known = profiles()
    if name not in known:
        raise UnknownNameError("workload", name, sorted(known))
    return known[name]


def published_points() -> list[PublishedPoint]:
    """The published power-cap measurements the model is checked against."""
    return [
        PublishedPoint(
            id=str(d["id"]),
            gpu=str(d["gpu"]),
            workload=str(d["workload"]),
            from_w=float(d["from_w"]),
            to_w=float(d["to_w"]),
            metric=str(d["metric"]),
            value=float(d["value"]),
            source=" ".join(str(d["source"]).split()),
        )
        for d in _data()["published"]
    ]


def not_reproduced() -> list[dict[str, str]]:
    """Published figures the model is known to miss (shown in docs and benchmarks)."""
    return [{k: " ".join(str(v).split()) for k, v in d.items()} for d in _data()["not_reproduced"]]


def published_savings() -> list[dict[str, Any]]:
    """Energy savings others report (seeds, Zeus, Perseus, NVIDIA), for the benchmark."""
    return list(_data()["savings"])


def idle_w(model: GpuModel) -> float:
    """A model's idle power: measured where the catalog has it, else 11.3 % of max (H200)."""
    return (
        model.idle_power_w if model.idle_power_w is not None else IDLE_FRACTION * model.max_power_w
    )


def capped_ratio(model: GpuModel) -> float:
    """Clock ratio of a bf16 matmul under the default limit (measured, else the reference's)."""
    eff = model.efficiency
    if eff is not None and eff.sustained_sm_clock_mhz and model.max_sm_clock_mhz:
        return eff.sustained_sm_clock_mhz / model.max_sm_clock_mhz
    return perf.capped_clock_ratio()


def load_power(
    model: GpuModel, clock_ratio: float, util: float, intensity: float, static: float
) -> float:
    """Watts a load draws at a clock ratio (the module doc's formula)."""
    span = model.max_power_w - idle_w(model)
    r0 = capped_ratio(model)
    return idle_w(model) + util * intensity * span * (
        static + (1.0 - static) * (clock_ratio / r0) ** 2
    )


def settle(
    model: GpuModel,
    limit_w: float,
    util: float,
    intensity: float,
    static: float,
    clock_cap_ratio: float = 1.0,
) -> tuple[float, float, bool]:
    """(clock ratio, watts, capped) a load settles at under a power limit."""
    top = max(MIN_CLOCK_RATIO, min(1.0, clock_cap_ratio))
    idle = idle_w(model)
    demand = util * intensity
    if demand <= 0:
        return top, idle, False
    full = load_power(model, top, util, intensity, static)
    if full <= limit_w:
        return top, full, False
    held = limit_w * CAP_HOLD_RATIO
    span = model.max_power_w - idle
    x = ((held - idle) / (demand * span) - static) / (1.0 - static)
    ratio = capped_ratio(model) * math.sqrt(max(x, 0.0))
    return max(MIN_CLOCK_RATIO, min(top, ratio)), held, True


def operating_point(
    model: GpuModel, limit_w: float, prof: Profile, util: float = 1.0
) -> OperatingPoint:
    """Where a GPU running ``prof`` at ``util`` settles under ``limit_w``."""
    ratio, power, capped = settle(model, limit_w, util, prof.intensity, prof.static)
    return OperatingPoint(limit_w, ratio, power, capped, prof.relative_throughput(ratio) * util)


def predict(point: PublishedPoint) -> float:
    """The model's value of a published point (throughput or energy ratio, to_w over from_w)."""
    model = load_catalog().gpu(point.gpu)
    prof = profile(point.workload)
    a = operating_point(model, point.from_w, prof)
    b = operating_point(model, point.to_w, prof)
    if point.metric == "throughput":
        return b.relative_throughput / a.relative_throughput
    if point.metric == "energy":
        return b.energy_per_work / a.energy_per_work
    raise ValueError(f"{point.id}: unknown metric {point.metric!r}")
