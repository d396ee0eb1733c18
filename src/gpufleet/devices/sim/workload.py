"""How long work takes on a simulated GPU: matmuls, copies, PCIe transfers and collectives.

Rates come from the catalog's performance model (``gpufleet.catalog.performance``: peaks x
measured efficiencies, the figures validation expects too); this module only turns them into
times. Faults change the answers: a slow GPU delivers a fraction of its peak, a downgraded PCIe
link moves fewer bytes, a power or thermal cap lowers the clock.
"""

from __future__ import annotations

from gpufleet.catalog import GpuModel
from gpufleet.catalog import performance as perf


def matmul_seconds(
    model: GpuModel,
    dtype: str,
    m: int,
    n: int,
    k: int,
    *,
    speed: float = 1.0,
    clock_ratio: float = 1.0,
) -> float:
    """Time of one m x k by k x n matmul (2mnk FLOPs)."""
    tflops = perf.matmul_tflops(model, dtype)
    if tflops is None:
        raise ValueError(f"{model.key} has no {dtype} matmul path")
    rate = tflops * 1e12 * speed * perf.clock_factor(clock_ratio)
    return _launch_s() + 2.0 * m * n * k / rate


def copy_seconds(model: GpuModel, nbytes: int, *, speed: float = 1.0) -> float:
    """Time to copy ``nbytes`` within device memory (reads and writes ``nbytes`` each)."""
    return _launch_s() + 2.0 * nbytes / (perf.hbm_copy_gbps(model) * 1e9 * speed)


def pcie_seconds(
    model: GpuModel,
    nbytes: int,
    *,
    gen: int | None = None,
    width: int | None = None,
    direction: str = "h2d",
) -> float:
    """Time of one pinned host<->device copy over the link as trained."""
    return _launch_s() + nbytes / (perf.pcie_gbps(model, gen, width, direction) * 1e9)


def collective_seconds(op: str, nbytes: int, n_gpus: int, busbw_gbps: float) -> float:
    """Time of one collective of ``nbytes`` per rank among ``n_gpus`` at a bus bandwidth."""
    if n_gpus < 2:
        perf.bus_factor(op, 2)  # validates the name
        return _launch_s()
    algbw = busbw_gbps * 1e9 / perf.bus_factor(op, n_gpus)
    return perf.model_data().collective_latency_s.value + nbytes / algbw


def _launch_s() -> float:
    return perf.model_data().launch_overhead_s.value
