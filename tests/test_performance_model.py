"""The performance model in the catalog: data with sources, and the one place validation's
pass lines and the simulator's workload times come from.

Expected figures are written from the H200 capture (tests/fixtures/nvidia-h200/load_trace.json)
and the data sheets (H100 SXM: 989.5 bf16 TFLOP/s dense, 3350 GB/s HBM3, PCIe Gen5 x16).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.catalog import loader as catalog_loader
from gpufleet.catalog import performance as perf
from gpufleet.catalog.models import Figure
from gpufleet.devices.sim import physics
from gpufleet.devices.sim import workload as wl
from gpufleet.validate import thresholds as th

TRACE = Path(__file__).parent / "fixtures" / "nvidia-h200" / "load_trace.json"


def test_every_figure_names_its_source() -> None:
    data = load_catalog().performance
    figures = [v for v in dict(data).values() if isinstance(v, Figure)]
    assert len(figures) >= 5
    for fig in figures:
        assert len(fig.source) > 20, fig
    assert "load_trace.json" in data.reference.source
    assert "PCI-SIG" in data.pcie_lane.source


def test_reference_clock_is_the_one_measured_in_the_h200_trace() -> None:
    trace = json.loads(TRACE.read_text())["trace"]
    burn = [p["sm_mhz"] for p in trace if p["phase"] == "burn"]
    settled = burn[len(burn) // 3 :]
    measured = sum(settled) / len(settled)
    assert perf.capped_clock_ratio() * 1980 == pytest.approx(measured, abs=5)


def test_h100_figures_are_its_peaks_times_the_h200_ratios() -> None:
    h100 = load_catalog().gpu("h100-sxm")
    assert perf.matmul_tflops(h100, "bf16") == pytest.approx(989.5 * 792.4 / 989.5)
    assert perf.matmul_tflops(h100, "fp64") == pytest.approx(67 * 61.4 / 67)
    assert perf.hbm_copy_gbps(h100) == pytest.approx(3350 * 4229.9 / 4800)
    assert perf.pcie_gbps(h100) == pytest.approx(55.5)  # same Gen5 x16 link as the H200
    # sustained: burst x (1 - s (1 - 1470/1980)), s fitted so the H200 gives 662.5 of 792.4
    s = (1 - 662.5 / 792.4) / (1 - 1470 / 1980)
    burst = 989.5 * 792.4 / 989.5
    assert perf.sustained_tflops(h100) == pytest.approx(burst * (1 - s * (1 - 1470 / 1980)))


def test_a_gpu_without_a_precision_has_no_expected_figure() -> None:
    l4 = load_catalog().gpu("l4")
    assert perf.matmul_tflops(l4, "fp64") is None
    assert th.expected_matmul_tflops(l4, "fp64") is None


def test_network_figure_is_the_nics_line_rate_times_the_efficiency() -> None:
    h200 = load_catalog().gpu("h200-sxm")
    assert perf.node_network_gbps(h200) == pytest.approx(8 * 400 / 8 * 0.90)


def test_recalibrating_the_catalog_moves_pass_lines_and_simulated_times_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One data change, both readers follow: nothing keeps a private copy of a figure."""
    cat = load_catalog()
    h200 = cat.gpus["h200-sxm"]
    assert h200.efficiency is not None
    eff = h200.efficiency.model_copy(update={"tflops": {**h200.efficiency.tflops, "bf16": 700.0}})
    gpus = {**cat.gpus, "h200-sxm": h200.model_copy(update={"efficiency": eff})}
    perf_data = cat.performance.model_copy(
        update={"launch_overhead_s": Figure(value=0.0, source="test")}
    )
    changed: Catalog = dataclasses.replace(cat, gpus=gpus, performance=perf_data)
    monkeypatch.setattr(perf, "load_catalog", lambda: changed)
    h100 = changed.gpus["h100-sxm"]
    expected = 989.5 * 700.0 / 989.5
    assert th.expected_matmul_tflops(h100, "bf16") == pytest.approx(expected)
    n = 8192
    seconds = wl.matmul_seconds(h100, "bf16", n, n, n)
    assert 2 * n**3 / seconds / 1e12 == pytest.approx(expected)
    assert catalog_loader.load_catalog() is cat  # the packaged catalog itself is untouched


def test_physics_calibration_reads_the_same_clock_ratio() -> None:
    """A bf16 matmul at the power limit settles at the catalog's capped clock."""
    h200 = load_catalog().gpu("h200-sxm")
    p = physics.PhysicsParams.for_model(h200.max_power_w, h200.idle_power_w, h200.max_sm_clock_mhz)
    clock, _power, capped = physics.steady_clock_and_power(p, h200.max_power_w, 1.0, 1.0, None)
    assert capped
    ratio = clock / 1980
    # held at 0.987 of the limit, so a little under the unheld ratio
    assert ratio == pytest.approx(1470 / 1980, rel=0.01)
