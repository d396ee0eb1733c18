"""The performance model: what a healthy GPU reaches, as data-sheet peaks x measured efficiency.

Every figure comes from the catalog: a model's own measured ``efficiency`` record (gpus.yaml)
where it has one, otherwise its peaks times the reference GPU's achieved/peak ratios, and the
constants of ``data/performance.yaml``, each with its source. Validation's expected figures (its
pass lines) and the simulator's workload times both read these functions, so recalibrating one
means changing the catalog, visibly, for both.

Collective arithmetic follows nccl-tests' ``doc/PERFORMANCE.md`` (github.com/NVIDIA/nccl-tests):
``busbw = algbw x 2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter and
alltoall, ``1`` for broadcast.
"""

from __future__ import annotations

from gpufleet.catalog.loader import load_catalog
from gpufleet.catalog.models import Efficiency, GpuModel, PerformanceModel

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests: busbw = algbw x factor (n ranks)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {sorted(COLLECTIVES)}")


def model_data() -> PerformanceModel:
    """The performance constants of the packaged catalog (``data/performance.yaml``)."""
    return load_catalog().performance


def _reference() -> tuple[GpuModel, Efficiency]:
    ref = load_catalog().gpus[model_data().reference.gpu]
    assert ref.efficiency is not None  # checked when the catalog loads
    return ref, ref.efficiency


def _matmul_peak(model: GpuModel, dtype: str) -> float | None:
    peak_key = model_data().matmul_peak.get(dtype, dtype)
    return model.tflops.get(peak_key) or model.tflops.get(dtype)


def matmul_efficiency(dtype: str) -> float | None:
    """Achieved / dense peak of a short matmul on the reference GPU; None if not measured."""
    ref, eff = _reference()
    achieved, peak = eff.tflops.get(dtype), _matmul_peak(ref, dtype)
    return None if achieved is None or not peak else achieved / peak


def matmul_tflops(model: GpuModel, dtype: str) -> float | None:
    """Short-burst matmul TFLOP/s a healthy GPU reaches; None if the precision is unsupported."""
    eff = model.efficiency
    if eff is not None and dtype in eff.tflops:
        return eff.tflops[dtype]
    peak, ratio = _matmul_peak(model, dtype), matmul_efficiency(dtype)
    return None if peak is None or ratio is None else peak * ratio


def capped_clock_ratio() -> float:
    """SM clock / max clock of the reference GPU in a sustained bf16 load at its power cap."""
    ref, eff = _reference()
    assert eff.sustained_sm_clock_mhz is not None and ref.max_sm_clock_mhz is not None
    return eff.sustained_sm_clock_mhz / ref.max_sm_clock_mhz


def clock_sensitivity() -> float:
    """How much throughput falls per unit of clock lost (a linear fit of the reference).

    Under a sustained load at the power cap throughput falls less than the clock: the H200's
    bf16 burn at 1470/1980 of max clock still delivers 662.5/792.4 of its burst.
    """
    _ref, eff = _reference()
    assert eff.sustained_bf16_tflops is not None
    burst = eff.tflops["bf16"]
    return (1 - eff.sustained_bf16_tflops / burst) / (1 - capped_clock_ratio())


def clock_factor(clock_ratio: float) -> float:
    """Throughput relative to burst at a given SM clock / max clock ratio."""
    r = max(0.0, min(1.0, clock_ratio))
    return 1.0 - clock_sensitivity() * (1.0 - r)


def sustained_tflops(model: GpuModel) -> float | None:
    """bf16 TFLOP/s under a sustained load at the power cap."""
    eff = model.efficiency
    if eff is not None and eff.sustained_bf16_tflops:
        return eff.sustained_bf16_tflops
    burst = matmul_tflops(model, "bf16")
    return None if burst is None else burst * clock_factor(capped_clock_ratio())


def hbm_copy_gbps(model: GpuModel) -> float:
    """Device-to-device copy bandwidth, counting read plus write."""
    eff = model.efficiency
    if eff is not None and eff.hbm_copy_gbps:
        return eff.hbm_copy_gbps
    ref, ref_eff = _reference()
    assert ref_eff.hbm_copy_gbps is not None
    return model.memory_bandwidth_gbps * ref_eff.hbm_copy_gbps / ref.memory_bandwidth_gbps


def pcie_lane_gbps(gen: int) -> float:
    """Payload GB/s of one lane of a PCIe generation (an unknown one counts as Gen3)."""
    rates = model_data().pcie_lane.gbps
    return rates.get(gen, rates[3])


def _pcie_link_gbps(model: GpuModel) -> float:
    return pcie_lane_gbps(model.pcie_generation) * model.pcie_lanes


def pcie_gbps(
    model: GpuModel, gen: int | None = None, width: int | None = None, direction: str = "h2d"
) -> float:
    """Pinned host<->device bandwidth over the link as trained (gen, width; None: full link)."""
    g = gen or model.pcie_generation
    w = width or model.pcie_lanes
    eff = model.efficiency
    measured = None
    if eff is not None:
        measured = eff.pcie_h2d_gbps if direction == "h2d" else eff.pcie_d2h_gbps
    if measured is None:
        ref, ref_eff = _reference()
        assert ref_eff.pcie_h2d_gbps is not None
        measured = _pcie_link_gbps(model) * ref_eff.pcie_h2d_gbps / _pcie_link_gbps(ref)
    return measured * pcie_lane_gbps(g) * w / _pcie_link_gbps(model)


def collective_busbw_gbps(model: GpuModel, link_fraction: float = 1.0) -> float:
    """Expected large-message bus bandwidth among GPUs of one node over their GPU link."""
    link = model.gpu_link_bandwidth_gbps
    if not link:
        link = _pcie_link_gbps(model) * 2  # PCIe, both ways
    return link / 2 * model_data().collective_link_efficiency.value * link_fraction


def node_network_gbps(model: GpuModel) -> float:
    """GB/s one node moves to another: its compute NICs' line rate x the network efficiency."""
    systems = load_catalog().systems_for(model.key)
    gbits = (
        systems[0].compute_nics * systems[0].compute_nic_gbps
        if systems
        else model_data().default_node_nic_gbits.value
    )
    return gbits / 8.0 * model_data().network_efficiency.value
