"""The power model against measurements it was not fitted to: published power-cap points for
A100 and H100 (sources in catalog/data/power.yaml), and the real H200 trace in the fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.catalog import power as pw
from gpufleet.errors import UnknownNameError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvidia-h200" / "load_trace.json"


def test_at_least_five_published_points_within_ten_percent() -> None:
    points = pw.published_points()
    gpus = {load_catalog().gpu(p.gpu).architecture for p in points}
    assert {"ampere", "hopper"} <= gpus  # A100 and H100 measurements both
    errors = {p.id: abs(pw.predict(p) - p.value) / p.value for p in points}
    within = [k for k, e in errors.items() if e <= 0.10]
    assert len(within) >= 5, errors
    assert within == list(errors), errors  # and none of the listed points is missed
    assert all(p.source for p in points)


def test_h200_fixture_burn_is_reproduced() -> None:
    """700 W cap: ~1470 MHz and 662.5 TFLOP/s sustained in the real trace; idle 79 W."""
    trace = json.loads(FIXTURE.read_text())
    burn = [s for s in trace["trace"] if s["phase"] == "burn"]
    late = burn[len(burn) // 2 :]
    clock = sum(s["sm_mhz"] for s in late) / len(late)
    power = sum(s["power_mw"] for s in late) / len(late) / 1000
    h200 = load_catalog().gpu("h200-sxm")
    op = pw.operating_point(h200, 700, pw.profile("matmul-bf16"))
    assert op.clock_ratio * 1980 == pytest.approx(clock, rel=0.02)
    assert op.power_w == pytest.approx(power, rel=0.02)
    burst = trace["matmul"]["bf16"]
    assert burst * op.relative_throughput == pytest.approx(
        trace["matmul"]["bf16_sustained_25s"], rel=0.02
    )
    assert pw.idle_w(h200) == pytest.approx(trace["trace"][0]["power_mw"] / 1000, abs=1)


def test_memory_bound_work_loses_much_less_than_compute_bound() -> None:
    h100 = load_catalog().gpu("h100-sxm")
    mm, hbm = pw.profile("matmul-bf16"), pw.profile("hbm")
    loss = {
        name: 1
        - pw.operating_point(h100, 400, prof).relative_throughput
        / pw.operating_point(h100, 700, prof).relative_throughput
        for name, prof in (("mm", mm), ("hbm", hbm))
    }
    assert loss["mm"] > 0.15
    assert loss["hbm"] < loss["mm"] / 3


def test_power_never_exceeds_the_limit_and_clock_falls_with_it() -> None:
    h200 = load_catalog().gpu("h200-sxm")
    prof = pw.profile("matmul-bf16")
    ops = [pw.operating_point(h200, w, prof) for w in range(700, 199, -50)]
    assert all(op.power_w <= op.limit_w for op in ops)
    clocks = [op.clock_ratio for op in ops]
    assert clocks == sorted(clocks, reverse=True) and clocks[-1] < clocks[0]


def test_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        pw.profile("matmul")
    assert "matmul-bf16" in str(info.value)
