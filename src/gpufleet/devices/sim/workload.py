"""How long work takes on a simulated GPU: matmuls, copies, PCIe transfers and collectives.

Figures are the catalog's peaks times measured efficiencies. Where a model has its own measured
figures (``GpuModel.efficiency``; the H200 from ``tests/fixtures/nvidia-h200/load_trace.json``)
those are used; otherwise the H200's achieved/peak ratios are applied to the model's peaks.
Faults change the answers: a slow GPU delivers a fraction of its peak, a downgraded PCIe link
moves fewer bytes, a power or thermal cap lowers the clock.
"""

from __future__ import annotations

from gpufleet.catalog import GpuModel

# Achieved / dense peak on the H200 (load_trace.json "matmul"; catalog h200-sxm peaks).
H200_MATMUL_EFFICIENCY = {
    "bf16": 792.4 / 989.5,
    "fp16": 762.5 / 989.5,
    "tf32": 401.2 / 494.5,
    "fp32": 50.8 / 67.0,
    "fp64": 61.4 / 67.0,  # PyTorch fp64 matmul runs on the FP64 tensor cores (67 TFLOP/s)
    "fp8": 1446.9 / 1979.0,
}
PEAK_KEY = {"fp64": "fp64_tensor"}
H200_HBM_COPY_EFFICIENCY = 4229.9 / 4800.0  # d2d copy, read + write, load_trace.json
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # PCI-SIG per-lane payload rates
H200_PCIE_EFFICIENCY = 55.5 / (3.938 * 16)  # pinned copies, Gen5 x16 (load_trace.json)
# Under a sustained load at the power cap, throughput falls less than the clock: a bf16 burn at
# 1470/1980 of max clock still delivers 662/792 of burst (load_trace.json). Linear fit:
CLOCK_SENSITIVITY = (1 - 662.5 / 792.4) / (1 - 1470 / 1980)
LAUNCH_OVERHEAD_S = 8e-6
# Assumption, not a measurement: NCCL reaches ~80 % of the one-way GPU link bandwidth in bus
# bandwidth on large messages. Replace with a measured baseline where one exists.
COLLECTIVE_LINK_EFFICIENCY = 0.80
COLLECTIVE_LATENCY_S = 20e-6


def bus_factor(op: str, n: int) -> float:
    """nccl-tests PERFORMANCE.md: busbw = algbw x factor (n ranks)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {sorted(COLLECTIVES)}")


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


def achieved_tflops(model: GpuModel, dtype: str) -> float | None:
    """Short-burst matmul TFLOP/s a healthy GPU reaches; None if the precision is unsupported."""
    eff = model.efficiency
    if eff is not None and dtype in eff.tflops:
        return eff.tflops[dtype]
    peak = model.tflops.get(PEAK_KEY.get(dtype, dtype)) or model.tflops.get(dtype)
    if peak is None or dtype not in H200_MATMUL_EFFICIENCY:
        return None
    return peak * H200_MATMUL_EFFICIENCY[dtype]


def clock_factor(clock_ratio: float) -> float:
    """Throughput relative to burst at a given SM clock / max clock ratio."""
    r = max(0.0, min(1.0, clock_ratio))
    return 1.0 - CLOCK_SENSITIVITY * (1.0 - r)


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
    tflops = achieved_tflops(model, dtype)
    if tflops is None:
        raise ValueError(f"{model.key} has no {dtype} matmul path")
    return LAUNCH_OVERHEAD_S + 2.0 * m * n * k / (tflops * 1e12 * speed * clock_factor(clock_ratio))


def hbm_copy_gbps(model: GpuModel) -> float:
    """Device-to-device copy bandwidth, counting read plus write."""
    eff = model.efficiency
    if eff is not None and eff.hbm_copy_gbps:
        return eff.hbm_copy_gbps
    return model.memory_bandwidth_gbps * H200_HBM_COPY_EFFICIENCY


def copy_seconds(model: GpuModel, nbytes: int, *, speed: float = 1.0) -> float:
    """Time to copy ``nbytes`` within device memory (reads and writes ``nbytes`` each)."""
    return LAUNCH_OVERHEAD_S + 2.0 * nbytes / (hbm_copy_gbps(model) * 1e9 * speed)


def pcie_gbps(
    model: GpuModel, gen: int | None = None, width: int | None = None, direction: str = "h2d"
) -> float:
    """Pinned host<->device bandwidth over the link as trained (gen, width)."""
    g = gen or model.pcie_generation
    w = width or model.pcie_lanes
    eff = model.efficiency
    measured = None
    if eff is not None:
        measured = eff.pcie_h2d_gbps if direction == "h2d" else eff.pcie_d2h_gbps
    full = (
        measured or PCIE_LANE_GBPS[model.pcie_generation] * model.pcie_lanes * H200_PCIE_EFFICIENCY
    )
    return (
        full
        * (PCIE_LANE_GBPS.get(g, 0.985) * w)
        / (PCIE_LANE_GBPS[model.pcie_generation] * model.pcie_lanes)
    )


def pcie_seconds(
    model: GpuModel,
    nbytes: int,
    *,
    gen: int | None = None,
    width: int | None = None,
    direction: str = "h2d",
) -> float:
    return LAUNCH_OVERHEAD_S + nbytes / (pcie_gbps(model, gen, width, direction) * 1e9)


def collective_busbw_gbps(model: GpuModel, link_fraction: float = 1.0) -> float:
    """Expected large-message bus bandwidth among GPUs of one node over their GPU link."""
    link = model.gpu_link_bandwidth_gbps
    if not link:
        link = PCIE_LANE_GBPS[model.pcie_generation] * model.pcie_lanes * 2  # PCIe, both ways
    return link / 2 * COLLECTIVE_LINK_EFFICIENCY * link_fraction


def collective_seconds(op: str, nbytes: int, n_gpus: int, busbw_gbps: float) -> float:
    """Time of one collective of ``nbytes`` per rank among ``n_gpus`` at a bus bandwidth."""
    if n_gpus < 2:
        bus_factor(op, 2)  # validates the name
        return LAUNCH_OVERHEAD_S
    factor = bus_factor(op, n_gpus)
    algbw = busbw_gbps * 1e9 / factor
    return COLLECTIVE_LATENCY_S + nbytes / algbw
