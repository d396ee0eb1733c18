"""The rack power budget's proposal (`gpufleet.energy.budget`), checked against the power model
directly: the proposed limits' expected power (the catalog model's operating point, evaluated
here, not taken from the proposal) stays under the budget, and no allocation in an exhaustive
search of a small mixed rack loses less throughput."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.catalog import performance as perf
from gpufleet.catalog import power as pw
from gpufleet.energy.budget import BudgetGpu, propose
from gpufleet.errors import UsageError

STEP = 50.0  # coarser than the default, so the exhaustive search stays small


def _model_point(model: str, limit: float, workload: str) -> tuple[float, float]:
    """(expected W, absolute throughput) of one GPU at a limit, straight from the catalog."""
    m = load_catalog().gpu(model)
    op = pw.operating_point(m, limit, pw.profile(workload))
    rate = perf.hbm_copy_gbps(m) if workload == "hbm" else perf.sustained_tflops(m)
    assert rate is not None
    return op.power_w, op.relative_throughput * rate


def _grid(model: str) -> list[float]:
    m = load_catalog().gpu(model)
    hi = m.power_limit_max_w or m.max_power_w
    lo = m.power_limit_min_w or 0.5 * m.max_power_w
    out = []
    w = hi
    while w > lo + 1e-9:
        out.append(w)
        w -= STEP
    return [*out, lo]


RACK = [
    BudgetGpu("n0", 0, "h100-sxm"),
    BudgetGpu("n0", 1, "h100-sxm"),
    BudgetGpu("n1", 0, "a100-sxm4-80gb"),
    BudgetGpu("n2", 0, "h200-sxm"),
]


@pytest.mark.parametrize("workload", ["matmul-bf16", "hbm"])
@pytest.mark.parametrize("budget", [2600.0, 2100.0, 1700.0, 1300.0])
def test_proposal_is_under_budget_and_no_allocation_loses_less(
    budget: float, workload: str
) -> None:
    p = propose(RACK, budget, workload, step_w=STEP)
    expected = [_model_point(a.model, a.limit_w, workload) for a in p.gpus]
    assert sum(w for w, _ in expected) <= budget
    assert [(a.node, a.gpu) for a in p.gpus] == [(g.node, g.gpu) for g in RACK]
    kept = sum(t for _, t in expected)
    full = sum(_model_point(g.model, _grid(g.model)[0], workload)[1] for g in RACK)
    assert p.throughput_lost == pytest.approx(1 - kept / full, abs=1e-9)
    # exhaustive: every combination of grid limits under the budget keeps no more throughput
    # (the proposal rounds each GPU's power up to a whole watt; allow that slack, 1 W per GPU)
    grids = [_grid(g.model) for g in RACK]
    best = 0.0
    for combo in itertools.product(*grids):
        points = [_model_point(g.model, lim, workload) for g, lim in zip(RACK, combo, strict=True)]
        if sum(w for w, _ in points) <= budget - len(RACK):
            best = max(best, sum(t for _, t in points))
    assert best > 0
    assert kept >= best - 1e-6, (kept, best, [a.limit_w for a in p.gpus])


def test_a_generous_budget_caps_nothing() -> None:
    p = propose(RACK, 10_000.0, step_w=STEP)
    assert p.throughput_lost == 0.0
    assert [a.limit_w for a in p.gpus] == [_grid(g.model)[0] for g in RACK]


def test_a_budget_below_the_lowest_limits_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="even at their lowest limits"):
        propose(RACK, 500.0, step_w=STEP)


def test_equal_gpus_share_a_tight_budget_nearly_equally() -> None:
    """Throughput is concave in power under the model: the best split of a budget among equal
    GPUs is (nearly) even, never one GPU starved and another at its max."""
    gpus = [BudgetGpu("n", i, "h100-sxm") for i in range(8)]
    p = propose(gpus, 8 * 480.0)
    limits = [a.limit_w for a in p.gpus]
    assert max(limits) - min(limits) <= 25.0, limits
    assert p.expected_w <= 8 * 480.0


@pytest.mark.process
def test_cli_budget_of_a_simulated_rack(tmp_path: Path) -> None:
    """``power budget --sim FLEET`` (no controller): the rack's nodes only, under the budget."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {name: h, model: h100-sxm, gpus: 8, count: 2, rack: r01}\n"
        "  - {name: a, model: a100-sxm4-80gb, gpus: 8, rack: r01}\n"
        "  - {name: x, model: h200-sxm, gpus: 8, rack: r02}\n",
        encoding="utf-8",
    )
    args = ["power", "budget", "--rack", "r01", "--watts", "9000", "--sim", str(fleet), "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["order"] is None
    gpus = doc["proposal"]["gpus"]
    assert sorted({g["node"] for g in gpus}) == ["a", "h-00", "h-01"]  # not x (rack r02)
    drawn = sum(_model_point(g["model"], g["limit_w"], "matmul-bf16")[0] for g in gpus)
    assert drawn <= 9000
    assert doc["proposal"]["per_node"]["a"]["0"] == gpus[0]["limit_w"]
