"""The performance model (catalog) and the simulator's workload times against the H200
measurements and nccl-tests arithmetic."""

from __future__ import annotations

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.catalog import performance as perf
from gpufleet.devices.sim import workload as w


def test_h200_matmul_reaches_the_measured_tflops() -> None:
    m = load_catalog().gpu("h200-sxm")
    n = 8192
    for dtype, measured in {
        "bf16": 792.4,
        "fp16": 762.5,
        "tf32": 401.2,
        "fp32": 50.8,
        "fp64": 61.4,
    }.items():
        t = w.matmul_seconds(m, dtype, n, n, n)
        assert 2 * n**3 / t / 1e12 == pytest.approx(measured, rel=0.01)


def test_sustained_at_the_power_cap_is_662() -> None:
    m = load_catalog().gpu("h200-sxm")
    n = 8192
    t = w.matmul_seconds(m, "bf16", n, n, n, clock_ratio=1470 / 1980)
    assert 2 * n**3 / t / 1e12 == pytest.approx(662.5, rel=0.01)


def test_slow_gpu_is_slow() -> None:
    m = load_catalog().gpu("h100-sxm")
    fast = w.matmul_seconds(m, "bf16", 4096, 4096, 4096)
    slow = w.matmul_seconds(m, "bf16", 4096, 4096, 4096, speed=0.85)
    assert slow / fast == pytest.approx(1 / 0.85, rel=0.01)


def test_missing_precision_raises() -> None:
    l4 = load_catalog().gpu("l4")
    with pytest.raises(ValueError):
        w.matmul_seconds(l4, "fp64", 1024, 1024, 1024)


def test_pcie_scales_with_gen_and_width() -> None:
    m = load_catalog().gpu("h200-sxm")
    assert perf.pcie_gbps(m) == pytest.approx(55.5)
    assert perf.pcie_gbps(m, gen=4) == pytest.approx(55.5 * 1.969 / 3.938)
    assert perf.pcie_gbps(m, width=8) == pytest.approx(55.5 / 2)


def test_hbm_copy_uses_measured_or_derived() -> None:
    h200 = load_catalog().gpu("h200-sxm")
    h100 = load_catalog().gpu("h100-sxm")
    assert perf.hbm_copy_gbps(h200) == pytest.approx(4229.9)
    assert perf.hbm_copy_gbps(h100) == pytest.approx(3350 * 4229.9 / 4800)
    nbytes = 4 * 2**30
    assert w.copy_seconds(h200, nbytes) == pytest.approx(2 * nbytes / 4229.9e9, rel=0.01)


@pytest.mark.parametrize(
    ("op", "factor"),
    [
        ("all_reduce", 2 * 7 / 8),
        ("all_gather", 7 / 8),
        ("reduce_scatter", 7 / 8),
        ("alltoall", 7 / 8),
        ("broadcast", 1.0),
    ],
)
def test_collective_bus_factors_for_8_ranks(op: str, factor: float) -> None:
    busbw = 360.0
    nbytes = 8 * 2**30
    t = w.collective_seconds(op, nbytes, 8, busbw)
    algbw = nbytes / (t - 20e-6) / 1e9  # performance.yaml: collective latency 20 us
    assert algbw * factor == pytest.approx(busbw, rel=1e-9)


def test_unknown_collective() -> None:
    with pytest.raises(ValueError, match="unknown collective"):
        w.collective_seconds("all_shuffle", 1, 8, 100)
