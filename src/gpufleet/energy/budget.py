"""A rack (or row) power budget: per-GPU power limits that keep the GPUs' expected power under
the budget with the least throughput lost.

Method. Every GPU gets one of a few candidate limits (its model's maximum, then down in
``step_w`` steps to its lowest settable limit). For each candidate the power model of the
catalog (`gpufleet.catalog.power.operating_point`: static and dynamic power, the clock a load
settles at under a limit, calibrated on the H200 fixture and checked against published A100
and H100 power-cap measurements, sources in ``catalog/data/power.yaml``) gives the GPU's
expected power at full load of the chosen workload (worst case for a budget: ``util`` 1) and
its throughput, weighted by the model's absolute rate (sustained bf16 TFLOP/s, or HBM copy GB/s
for ``hbm``) so that a watt taken from a slower GPU costs less. Choosing one candidate per GPU
so that the sum of expected power is <= the budget and the sum of throughput is the largest is a
multiple-choice knapsack; it is solved exactly by dynamic programming over whole watts (each
candidate's power rounded *up* to a watt, so the proposal never exceeds the budget in the
model; it may leave up to a watt per GPU unused). Equal-marginal (greedy) allocation, which
Zeus-style per-job tuners approximate, is optimal only on smooth concave curves; the exact
program costs milliseconds for a rack (GPUs x budget watts x candidates, vectorised).

Only the GPUs' power is budgeted (the rest of the servers' draw is the site's to subtract).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpufleet.catalog import load_catalog
from gpufleet.catalog import performance as perf
from gpufleet.catalog import power as pw
from gpufleet.catalog.models import GpuModel
from gpufleet.errors import UsageError

DEFAULT_STEP_W = 25.0


@dataclass(frozen=True)
class BudgetGpu:
    """One GPU of the rack: where it is, its catalog model and its settable range."""

    node: str
    gpu: int
    model: str
    min_w: float | None = None  # None: the catalog's (or half the max)
    max_w: float | None = None  # None: the catalog's max power


@dataclass(frozen=True)
class Candidate:
    """One limit a GPU may get, with its expected power and weighted throughput."""

    limit_w: float
    power_w: float
    throughput: float


@dataclass(frozen=True)
class Assignment:
    """The limit proposed for one GPU."""

    node: str
    gpu: int
    model: str
    limit_w: float
    expected_w: float
    throughput_lost: float  # fraction of this GPU's throughput at its max limit


@dataclass(frozen=True)
class Proposal:
    """Per-GPU limits for a budget, with the rack's expected power and throughput lost."""

    budget_w: float
    workload: str
    gpus: list[Assignment]
    expected_w: float
    uncapped_w: float
    throughput_lost: float  # fraction of the rack's throughput at max limits

    def to_json(self, rack: str) -> dict[str, Any]:
        """The document ``GET /api/v1/power/budget`` and ``power budget --json`` print."""
        return {**asdict(self), "rack": rack, "per_node": self.per_node()}

    def per_node(self) -> dict[str, dict[str, float]]:
        """The plan as a power order's ``per_node`` (GPU index as a string -> watts)."""
        out: dict[str, dict[str, float]] = {}
        for a in self.gpus:
            out.setdefault(a.node, {})[str(a.gpu)] = a.limit_w
        return out


def weight(model: GpuModel, workload: str) -> float:
    """A model's absolute rate for the workload (so losses of mixed models add up)."""
    if workload == "hbm":
        return float(perf.hbm_copy_gbps(model))
    return float(perf.sustained_tflops(model) or model.tflops.bf16 or 1.0)


def candidates(g: BudgetGpu, workload: str, step_w: float = DEFAULT_STEP_W) -> list[Candidate]:
    """The limits a GPU may get, from its max down in ``step_w`` to its min, evaluated."""
    model = load_catalog().gpu(g.model)
    prof = pw.profile(workload)
    hi = g.max_w if g.max_w is not None else model.power_limit_max_w or model.max_power_w
    lo = g.min_w if g.min_w is not None else model.power_limit_min_w or 0.5 * model.max_power_w
    limits = [hi]
    while limits[-1] - step_w > lo + 1e-9:
        limits.append(limits[-1] - step_w)
    if limits[-1] > lo:
        limits.append(lo)
    w = weight(model, workload)
    out = []
    for lim in limits:
        op = pw.operating_point(model, lim, prof)
        out.append(Candidate(lim, op.power_w, op.relative_throughput * w))
    return out


def propose(
    gpus: Sequence[BudgetGpu],
    budget_w: float,
    workload: str = "matmul-bf16",
    step_w: float = DEFAULT_STEP_W,
) -> Proposal:
    """The least-loss per-GPU limits whose expected power sums to <= ``budget_w``."""
    if not gpus:
        raise UsageError("no GPU to budget (is the rack empty, or its nodes not reporting?)")
    cands = [candidates(g, workload, step_w) for g in gpus]
    floor_w = sum(min(math.ceil(c.power_w) for c in cs) for cs in cands)
    if floor_w > budget_w:
        raise UsageError(
            f"--watts {budget_w:g}: even at their lowest limits the {len(gpus)} GPUs are "
            f"expected to draw {floor_w:g} W"
        )
    cap = math.floor(budget_w)
    top_w = sum(math.ceil(max(c.power_w for c in cs)) for cs in cands)
    cap = min(cap, top_w)
    # best[w]: the most throughput with expected power (whole watts, rounded up) <= w
    neg = -np.inf
    best = np.zeros(cap + 1)
    picks = np.zeros((len(gpus), cap + 1), dtype=np.int16)
    for i, cs in enumerate(cands):
        new = np.full(cap + 1, neg)
        choice = np.zeros(cap + 1, dtype=np.int16)
        for j, c in enumerate(cs):
            p = math.ceil(c.power_w)
            if p > cap:
                continue
            shifted = np.full(cap + 1, neg)
            shifted[p:] = best[: cap + 1 - p] + c.throughput
            better = shifted > new
            new[better] = shifted[better]
            choice[better] = j
        best, picks[i] = new, choice
    w = int(np.argmax(best))  # the first of the best: the least power among ties
    chosen: list[int] = [0] * len(gpus)
    for i in range(len(gpus) - 1, -1, -1):
        j = int(picks[i][w])
        chosen[i] = j
        w -= math.ceil(cands[i][j].power_w)
    rows = []
    for g, cs, j in zip(gpus, cands, chosen, strict=True):
        c = cs[j]
        full = cs[0].throughput
        rows.append(
            Assignment(g.node, g.gpu, g.model, c.limit_w, c.power_w, 1 - c.throughput / full)
        )
    total = sum(cs[0].throughput for cs in cands)
    kept = sum(cs[j].throughput for cs, j in zip(cands, chosen, strict=True))
    return Proposal(
        budget_w=budget_w,
        workload=workload,
        gpus=rows,
        expected_w=sum(a.expected_w for a in rows),
        uncapped_w=sum(cs[0].power_w for cs in cands),
        throughput_lost=1 - kept / total,
    )
