"""PyTorch engine: gloo collectives on CPU (runs here), CUDA paths on a real GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import torch  # CI installs the CPU build (Makefile): a missing torch must fail, not skip
else:
    torch = pytest.importorskip("torch", reason="needs the CPU build of torch (make install)")


@pytest.mark.slow
@pytest.mark.process
def test_gloo_collectives_arithmetic() -> None:
    from gpufleet.validate.engine_torch import run_local_collectives

    rows = run_local_collectives(4, "gloo", 8, 2**16, iters=2, timeout_s=120)
    assert {r.op for r in rows} == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "broadcast",
    }
    factor = {
        "all_reduce": 2 * 3 / 4,
        "all_gather": 3 / 4,
        "reduce_scatter": 3 / 4,
        "alltoall": 3 / 4,
        "broadcast": 1.0,
    }
    for r in rows:
        assert r.time_us > 0
        assert r.algbw_gbps == pytest.approx(r.size_bytes / (r.time_us / 1e6) / 1e9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * factor[r.op])


@pytest.mark.gpu
def test_level2_on_real_gpu_passes_and_matches_h200_fixture(h200_dir: Path) -> None:
    from gpufleet.validate.engine_torch import TorchEngine
    from gpufleet.validate.runner import RunOptions, run_suite
    from gpufleet.validate.suite import select_tests

    engine = TorchEngine.open()
    report = run_suite(engine, RunOptions(tests=select_tests(2), level=2, gpus=[0]))
    assert report.status.value != "fail", [r.message for r in report.failures()]
    if "H200" in report.env[0].name:
        fx = json.loads((h200_dir / "load_trace.json").read_text())
        mm = next(r for r in report.results if r.test == "matmul")
        for dtype in ("bf16", "fp16", "tf32"):
            m = mm.metric(dtype)
            assert m is not None and m.value == pytest.approx(fx["matmul"][dtype], rel=0.10)
        hbm = next(r for r in report.results if r.test == "hbm_bandwidth").metric("copy")
        assert hbm is not None
        assert hbm.value == pytest.approx(fx["bandwidth"]["d2d_copy_GBps_read_plus_write"], rel=0.1)
        pcie = next(r for r in report.results if r.test == "pcie_bandwidth").metric("h2d")
        assert pcie is not None
        assert pcie.value == pytest.approx(fx["bandwidth"]["h2d_pinned_GBps"], rel=0.10)
