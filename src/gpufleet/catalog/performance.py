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


def node_nics(model: GpuModel) -> tuple[int, float]:
    """(compute NICs, Gb/s each) of the model's system (systems.yaml), else the default."""
    systems = load_catalog().systems_for(model.key)
    if systems:
        return systems[0].compute_nics, float(systems[0].compute_nic_gbps)
    total = model_data().default_node_nic_gbits.value
    return 8, total / 8


def node_network_gbps(model: GpuModel, ranks_per_node: int | None = None) -> float:
    """GB/s one node moves to another: its compute NICs' line rate x the network efficiency.

    With ``ranks_per_node`` GPUs each on its own rail, only min(ranks, NICs) NICs carry data.
    """
    nics, gbits = node_nics(model)
    used = nics if ranks_per_node is None else max(1, min(ranks_per_node, nics))
    return used * gbits / 8.0 * model_data().network_efficiency.value


def p2p_gbps(model: GpuModel) -> float | None:
    """GPU-to-GPU copy bandwidth over NVLink (one direction): the catalog's GPU-link bandwidth
    (both directions, data sheet) / 2 x the NVLink peer-copy efficiency; None without NVLink."""
    if model.gpu_link.value != "nvlink" or not model.gpu_link_bandwidth_gbps:
        return None
    return model.gpu_link_bandwidth_gbps / 2 * model_data().nvlink_p2p_efficiency.value


# ----- collectives over a fabric -------------------------------------------------------------
# Expected large-message bus bandwidth per collective, from the hardware bottleneck as nccl-tests'
# doc/PERFORMANCE.md defines busbw ("the bus bandwidth should reflect the speed of the hardware
# bottleneck: NVLink, PCI, QPI, or network"). Inside a node the bottleneck is each GPU's link
# (`collective_busbw_gbps`). Across nodes NCCL runs one ring/channel per NIC rail, so a ring
# collective crosses every node boundary on every NIC at once: the node's NICs in use x line
# rate x efficiency is the network's share (8 x 400 Gb/s x 0.9 = 360 GB/s on a DGX H200).


def _link_or_network(
    model: GpuModel, nodes: int, ranks_per_node: int, net_fraction: float
) -> float:
    """The slower of a GPU's link (`collective_busbw_gbps`) and, across nodes, the node's
    network share (``net_fraction`` of `node_network_gbps`)."""
    link = collective_busbw_gbps(model)
    if nodes <= 1:
        return link
    return min(link, node_network_gbps(model, ranks_per_node) * net_fraction)


def ring_busbw(
    model: GpuModel, nodes: int, ranks_per_node: int, net_fraction: float = 1.0
) -> float:
    """all_reduce, all_gather, reduce_scatter: every rank sends (n-1)/n (x2 for all_reduce) of
    the buffer over its slowest hop, so busbw is the slower of the GPU link and the node's
    network share."""
    return _link_or_network(model, nodes, ranks_per_node, net_fraction)


def broadcast_busbw(
    model: GpuModel, nodes: int, ranks_per_node: int, net_fraction: float = 1.0
) -> float:
    """broadcast (busbw = algbw = S/t): all data leaves the root, so the root's way out is the
    bottleneck: its GPU link inside the node, and its node's NICs towards the other nodes
    (pipelined rings, one per rail)."""
    return _link_or_network(model, nodes, ranks_per_node, net_fraction)


def alltoall_busbw(
    model: GpuModel, nodes: int, ranks_per_node: int, net_fraction: float = 1.0
) -> float:
    """alltoall: each rank sends S/n to every rank; (n-k)/n of it leaves the node over the
    rank's share of the NICs, (k-1)/n stays on NVLink (in parallel). t = max of the two;
    busbw = S/t x (n-1)/n. Inside one node it is the GPU link's figure."""
    intra = collective_busbw_gbps(model)
    k = max(1, ranks_per_node)
    n = max(1, nodes) * k
    if nodes <= 1 or n < 2:
        return intra
    per_rank_net = node_network_gbps(model, k) * net_fraction / k
    t_net = (n - k) / n / per_rank_net
    t_nv = (k - 1) / n / intra
    return (n - 1) / n / max(t_net, t_nv)


def expected_busbw(
    model: GpuModel, op: str, nodes: int = 1, ranks_per_node: int = 8, net_fraction: float = 1.0
) -> float:
    """Expected large-message busbw of one collective over ``nodes`` x ``ranks_per_node``."""
    if op in ("all_reduce", "all_gather", "reduce_scatter"):
        return ring_busbw(model, nodes, ranks_per_node, net_fraction)
    if op == "broadcast":
        return broadcast_busbw(model, nodes, ranks_per_node, net_fraction)
    if op == "alltoall":
        return alltoall_busbw(model, nodes, ranks_per_node, net_fraction)
    raise ValueError(f"unknown collective {op!r}; known: {sorted(COLLECTIVES)}")


def expected_busbw_by_op(
    model: GpuModel, nodes: int = 1, ranks_per_node: int = 8, net_fraction: float = 1.0
) -> dict[str, float]:
    """`expected_busbw` of every collective."""
    return {
        op: expected_busbw(model, op, nodes, ranks_per_node, net_fraction) for op in COLLECTIVES
    }
