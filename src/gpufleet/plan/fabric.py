"""Network fabric: rail-optimized non-blocking fat trees, cables by reach class, management nets.

Sources:
- Fat-tree counts: Al-Fares, Loukissas, Vahdat 2008, "A Scalable, Commodity Data Center Network
  Architecture" (SIGCOMM): switches of radix k; two levels serve k^2/2 hosts (k leaves, k/2 spines
  at full size), three levels k^3/4 (k pods of k/2 edge + k/2 aggregation, (k/2)^2 cores).
- Rail-optimized layout and the reference counts: NVIDIA DGX SuperPOD with DGX B200 Reference
  Architecture (RA-11334): scalable unit (SU) of 32 nodes, 8 compute NICs per node, 64-port
  400G switches; 2 SU = 16 leaf + 8 spine, 4 SU = 32 + 16, 8 SU = 64 + 32.
- Balanced spines: every leaf spreads its k/2 uplinks evenly, the same number to each spine, so
  the spine count divides k/2 (equal-cost multipath over leaf-spine links; a leaf with 32 uplinks
  and 12 spines would send 3 links to some spines and 2 to others). The smallest such count whose
  ports hold every uplink is chosen: it fills the spines' ports best.
- Management nodes on the compute fabric: NVIDIA DGX SuperPOD with DGX B200 (and DGX H100)
  Reference Architecture, "Network Fabrics", Table 4 "Compute fabric component count": 1/2/3/4 SU
  hold 31/63/95/127 nodes, 8/16/24/32 leaf + 4/8/16/16 spine switches and 252/508/764/1,020
  "Compute and UFM" cables (8 per node + 4 for UFM) with 256/512/768/1,024 spine-leaf cables;
  footnote: "a DGX system must be removed to accommodate for UFM connectivity". So the UFM
  appliances take 4 compute-fabric ports, in one node slot (of 8 rail ports) of the tree.
- East-west need: a compute fabric carries traffic between nodes, so it is planned only when a
  workload's parallelism spans nodes (multi-node training: data-parallel gradient all-reduce, or
  tensor/pipeline groups larger than a node; inference replicas larger than a node; coupled HPC
  codes); replicas that fit in one node talk over NVLink inside it and reach users and storage
  over the storage and in-band networks (NVIDIA DGX SuperPOD RA: the compute fabric is the
  InfiniBand fabric "for multi-node" traffic; storage and in-band are separate networks).
- Reach classes: passive DAC to 3 m (IEEE 802.3ck/NVIDIA LinkX DAC lengths), multimode SR4 optics
  50 m on OM4 (NVIDIA LinkX 400G OSFP SR4, MMA4Z00-NS), single-mode DR4 500 m on OS2
  (400GBASE-DR4, IEEE 802.3bs), FR4 2 km on OS2 (400GBASE-FR4, 100G Lambda MSA).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.plan.sizing import WorkloadPlan

__all__ = [
    "CableLine",
    "Fabric",
    "FatTree",
    "Layout",
    "balanced_spines",
    "cable_class",
    "compute_fabric_need",
    "fat_tree",
    "node_rack",
    "plan_fabric",
    "rack_run",
]

STANDARD_LENGTHS_M = (
    1,
    1.5,
    2,
    2.5,
    3,
    5,
    7,
    10,
    15,
    20,
    30,
    50,
    70,
    100,
    150,
    200,
    300,
    500,
    1000,
    2000,
)
# (max reach m, medium, transceiver, fibre) in order of preference.
REACH_CLASSES: tuple[tuple[float, str, str | None, str | None], ...] = (
    (3.0, "DAC", None, None),
    (50.0, "MM optics", "400G SR4", "OM4 MPO-12"),
    (500.0, "SM optics", "400G DR4", "OS2 MPO-12"),
    (2000.0, "SM optics", "400G FR4", "OS2 duplex LC"),
)
OOB_SWITCH_PORTS = 48  # 1 GbE management switch
RA_UFM_COMPUTE_LINKS = 4  # DGX SuperPOD RA Table 4: "Compute and UFM" = 8 x nodes + 4
VERTICAL_SLACK_M = 3.0  # up into the tray and down into the rack, plus service loop


@dataclass(frozen=True)
class FatTree:
    """Switch and link counts of one non-blocking (rail-optimized) fat tree."""

    nodes: int
    ports_per_node: int
    radix: int
    levels: int
    leaves: int
    spines: int
    cores: int
    endpoint_links: int
    leaf_spine_links: int
    spine_core_links: int
    spine_reason: str = ""
    management_links: int = 0  # management-node (UFM) links on leaf ports, after the nodes'

    @property
    def uplinks_per_leaf(self) -> int:
        return self.leaf_spine_links // self.leaves if self.leaves and self.levels > 1 else 0

    @property
    def management_slots(self) -> int:
        """Node slots the management links take (RA: UFM's 4 links take one node's slot)."""
        ppn = self.ports_per_node
        return -(-self.management_links // ppn) if ppn else 0

    @property
    def endpoints(self) -> int:
        return self.nodes * self.ports_per_node + self.management_links

    @property
    def switches(self) -> int:
        return self.leaves + self.spines + self.cores


def balanced_spines(leaves: int, uplinks: int, radix: int) -> tuple[int, str]:
    """The fewest spines that divide each leaf's ``uplinks`` evenly and hold all of them."""
    need = math.ceil(leaves * uplinks / radix)
    spines = next(s for s in range(need, uplinks + 1) if uplinks % s == 0)
    used = leaves * uplinks // spines
    why = (
        f"{spines} spines: each leaf sends {uplinks // spines} of its {uplinks} uplinks to every "
        f"spine; {used} of {radix} ports used per spine"
    )
    if spines != need:
        why += (
            f" ({need} spines would have enough ports but {uplinks} uplinks do not divide "
            f"evenly over {need})"
        )
    return spines, why


def fat_tree(nodes: int, ports_per_node: int, radix: int, management_links: int = 0) -> FatTree:
    """Counts for ``nodes`` x ``ports_per_node`` endpoints on radix-``radix`` switches.

    One switch when all endpoints fit on it. Otherwise rail-optimized leaves: each rail gets one
    leaf per group of k/2 nodes, every leaf has k/2 uplinks; two levels while leaves <= k (spines
    = leaves*k/2/k), three levels beyond (an aggregation switch per leaf, cores = aggregation/2),
    up to k^3/4 endpoints. ``management_links`` (UFM) take node slots after the nodes, one slot
    per ``ports_per_node`` links (the DGX SuperPOD RA gives UFM one node's slot).
    """
    k = radix
    links = management_links if nodes and ports_per_node else 0
    slots = -(-links // ports_per_node) if links else 0
    e = nodes * ports_per_node + links
    if e == 0:
        return FatTree(nodes, ports_per_node, k, 0, 0, 0, 0, 0, 0, 0)
    if e <= k:
        return FatTree(nodes, ports_per_node, k, 1, 1, 0, 0, e, 0, 0, management_links=links)
    half = k // 2
    leaves = ports_per_node * math.ceil((nodes + slots) / half)
    if leaves <= k:
        spines, why = balanced_spines(leaves, half, k)
        return FatTree(
            nodes, ports_per_node, k, 2, leaves, spines, 0, e, leaves * half, 0, why, links
        )
    if leaves > k * half:
        raise UsageError(
            f"{e} endpoints exceed a three-level fat tree of radix {k} ({k**3 // 4} endpoints)",
            hint="raise constraints.switch_radix or split the cluster",
        )
    spines = leaves
    cores = math.ceil(spines * half / k)
    return FatTree(
        nodes,
        ports_per_node,
        k,
        3,
        leaves,
        spines,
        cores,
        e,
        leaves * half,
        spines * half,
        f"three levels: one aggregation switch per leaf ({half} leaves + {half} aggregation a "
        f"pod, one link from each leaf to each aggregation switch), {cores} cores",
        links,
    )


def cable_class(length_m: float) -> tuple[str, str | None, str | None]:
    """Medium, transceiver type and fibre for a link of ``length_m``."""
    for reach, medium, xcvr, fibre in REACH_CLASSES:
        if length_m <= reach:
            return medium, xcvr, fibre
    raise UsageError(
        f"a {length_m:.0f} m link exceeds 2 km single-mode reach",
        hint="lower constraints.racks_per_row or split the site",
    )


def standard_length(length_m: float) -> float:
    """The shortest stock cable length at or above ``length_m``."""
    return next((float(x) for x in STANDARD_LENGTHS_M if x >= length_m - 1e-9), length_m)


@dataclass(frozen=True)
class CableLine:
    """Cables of one network, tier, type and stock length; optics need two transceivers each."""

    network: str
    tier: str
    medium: str
    length_m: float
    count: int
    transceiver: str | None
    transceivers: int
    fibre: str | None


@dataclass(frozen=True)
class Layout:
    """Where racks stand: rows of ``racks_per_row`` with a network rack mid-row for the leaves
    and the spine/core racks in a central row."""

    racks: int
    servers_per_rack: int
    racks_per_row: int
    rack_width_m: float
    row_pitch_m: float

    @property
    def rows(self) -> int:
        return max(1, math.ceil(self.racks / self.racks_per_row))


def rack_run(layout: Layout, rack: int) -> float:
    """Stock length from a server in ``rack`` to its row's leaf rack (mid-row)."""
    if layout.racks <= 1:
        return standard_length(2.0)  # leaf in the same rack
    pos = rack % layout.racks_per_row
    in_row = min(
        layout.racks_per_row,
        layout.racks - (rack // layout.racks_per_row) * layout.racks_per_row,
    )
    mid = (in_row - 1) / 2
    return standard_length(abs(pos - mid) * layout.rack_width_m + VERTICAL_SLACK_M)


def node_rack(layout: Layout, node: int) -> int:
    """The rack of node ``node``: racks fill in order; nodes beyond them (management nodes)
    stand in the last rack's row."""
    return max(0, min(node // max(layout.servers_per_rack, 1), layout.racks - 1))


def _endpoint_lengths(layout: Layout, nodes: int) -> dict[float, int]:
    """Nodes by their run to the row's leaf rack (stock length)."""
    out: dict[float, int] = defaultdict(int)
    if layout.racks <= 1:
        out[rack_run(layout, 0)] += nodes
        return out
    per_rack = max(layout.servers_per_rack, 1)
    for rack in range(layout.racks):
        n = max(0, min(per_rack, nodes - rack * per_rack))
        if rack == layout.racks - 1:
            n = max(0, nodes - rack * per_rack)
        out[rack_run(layout, rack)] += n
    return out


def _row_lengths(layout: Layout) -> dict[float, float]:
    """Fraction of leaf uplinks by row-to-central-row run (stock length)."""
    out: dict[float, float] = defaultdict(float)
    mid = (layout.rows - 1) / 2
    half_row = min(layout.racks, layout.racks_per_row) / 2 * layout.rack_width_m
    for row in range(layout.rows):
        run = abs(row - mid) * layout.row_pitch_m + half_row + 2 * VERTICAL_SLACK_M
        out[standard_length(run)] += 1 / layout.rows
    return out


def _lines(network: str, tier: str, by_length: dict[float, int]) -> list[CableLine]:
    lines = []
    for length, count in sorted(by_length.items()):
        if count <= 0:
            continue
        medium, xcvr, fibre = cable_class(length)
        lines.append(
            CableLine(network, tier, medium, length, count, xcvr, 2 * count if xcvr else 0, fibre)
        )
    return lines


def _spread(total: int, fractions: dict[float, float]) -> dict[float, int]:
    """Split ``total`` links over lengths by fraction, keeping the sum exact."""
    out: dict[float, int] = {}
    items = sorted(fractions.items())
    given = 0
    for i, (length, frac) in enumerate(items):
        n = total - given if i == len(items) - 1 else round(total * frac)
        out[length] = n
        given += n
    return out


def cables_for(network: str, tree: FatTree, layout: Layout) -> list[CableLine]:
    """Cables of one tree: every endpoint link once, every switch-to-switch link once."""
    per_server = _endpoint_lengths(layout, tree.nodes)
    by_length = {length: n * tree.ports_per_node for length, n in per_server.items()}
    if tree.management_links:  # management nodes stand in the last rack's row (node_rack)
        run = rack_run(layout, max(layout.racks - 1, 0))
        by_length[run] = by_length.get(run, 0) + tree.management_links
    lines = _lines(network, "node-leaf", by_length)
    if tree.leaf_spine_links:
        lines += _lines(network, "leaf-spine", _spread(tree.leaf_spine_links, _row_lengths(layout)))
    if tree.spine_core_links:
        central_racks = math.ceil((tree.spines + tree.cores) / 16)  # 16 x 1-2U switches a rack
        run = standard_length(central_racks / 2 * layout.rack_width_m + 2 * VERTICAL_SLACK_M)
        lines += _lines(network, "spine-core", {run: tree.spine_core_links})
    return lines


@dataclass(frozen=True)
class Fabric:
    """Compute (east-west), storage, in-band and out-of-band management networks."""

    compute: FatTree
    storage: FatTree
    inband: FatTree
    oob_switches: int
    oob_links: int
    cables: tuple[CableLine, ...]
    port_gbps: int
    data_switches: int
    servers: int = 0
    management_nodes: int = 0
    compute_reason: str = ""
    management_reason: str = ""
    management_grew: bool = False  # the management links added switches to the compute tree

    @property
    def transceivers(self) -> int:
        return sum(c.transceivers for c in self.cables)


def plan_fabric(
    *,
    servers: int,
    compute_nics: int,
    storage_nics: int,
    radix: int,
    port_gbps: int,
    layout: Layout,
    pdus: int,
    management_nodes: int = 0,
    management_compute_links: int = 0,
    compute_reason: str = "",
) -> Fabric:
    """All networks for ``servers`` nodes laid out as ``layout``; ``compute_nics`` 0 plans no
    compute fabric; ``management_compute_links`` UFM links join the compute tree's leaves."""
    # One node needs no data switches: its GPUs talk over NVLink/PCIe inside the server and its
    # NICs uplink to the site network; the out-of-band switch stays.
    n = servers if servers > 1 else 0
    links = management_compute_links if management_nodes else 0
    compute = fat_tree(n, compute_nics, radix, links)
    why = _management_reason(n, compute_nics, radix, compute) if links else ""
    storage = fat_tree(n, storage_nics, radix)
    inband = fat_tree(n + management_nodes if n else 0, 1, radix)  # + head/UFM nodes
    cables = (
        cables_for("compute", compute, layout)
        + cables_for("storage", storage, layout)
        + cables_for("in-band", inband, layout)
    )
    data_switches = compute.switches + storage.switches + inband.switches
    oob_ports = servers + management_nodes + pdus + data_switches
    oob_switches = math.ceil(oob_ports / OOB_SWITCH_PORTS) if oob_ports else 0
    cables.append(
        CableLine("out-of-band", "node-switch", "Cat6 copper", 3.0, oob_ports, None, 0, None)
    )
    return Fabric(
        compute=compute,
        storage=storage,
        inband=inband,
        oob_switches=oob_switches,
        oob_links=oob_ports,
        cables=tuple(cables),
        port_gbps=port_gbps,
        data_switches=data_switches,
        servers=servers,
        management_nodes=management_nodes,
        compute_reason=compute_reason,
        management_reason=why,
        management_grew=bool(links)
        and compute.switches > fat_tree(n, compute_nics, radix).switches,
    )


def _management_reason(nodes: int, nics: int, radix: int, tree: FatTree) -> str:
    """Where the management (UFM) links sit on the compute leaves, and what they cost."""
    links = tree.management_links
    if not links:
        return "management nodes: no compute fabric to join"
    bare = fat_tree(nodes, nics, radix)
    head = f"management (UFM) nodes take {links} compute-fabric leaf ports"
    if (bare.leaves, bare.spines, bare.cores) == (tree.leaves, tree.spines, tree.cores):
        return head + ", in free node ports (no extra switch)"
    down = bare.leaves * (radix // 2) if bare.levels > 1 else radix
    return (
        f"{head}; the {nodes} nodes leave too few free node ports ({nodes * nics} of {down} "
        f"used), so the tree grows from {bare.leaves} leaf / {bare.spines} spine to "
        f"{tree.leaves} / {tree.spines}; the NVIDIA DGX SuperPOD RA gives UFM one node's slot "
        f"instead (127 nodes in 4 SU): {down // nics - tree.management_slots} nodes keep "
        f"{bare.leaves} / {bare.spines}"
    )


def compute_fabric_need(
    workloads: Sequence[WorkloadPlan],
    gpus_per_server: int,
    servers: int,
    coupled: Sequence[bool] = (),
) -> tuple[bool, str]:
    """Whether any workload's parallelism spans nodes (a compute fabric is needed), and why.

    ``coupled[i]`` False marks HPC workload ``i`` as independent tasks (render frames, sweeps)."""
    if servers <= 1:
        return False, "one node: its GPUs talk over NVLink/PCIe inside the server"
    g = max(gpus_per_server, 1)
    spans: list[str] = []
    local: list[str] = []
    for i, w in enumerate(workloads):
        nodes = -(-w.gpus // g)
        if w.training:
            m = w.training.memory
            tp, pp, dp = m.tensor_parallel, m.pipeline_parallel, m.data_parallel
            group = tp * pp
            if nodes <= 1:
                local.append(f"{w.name} trains on one node")
                continue
            where = "inside a node" if group <= g else f"across {-(-group // g)} nodes"
            why = f"{w.name} over {nodes} nodes: tp {tp} x pp {pp} = {group} GPUs {where}"
            if dp > 1:
                why += f", data parallel {dp} all-reduces gradients between nodes"
            spans.append(why)
        elif w.inference:
            inf = w.inference
            if inf.nodes_per_replica > 1:
                spans.append(
                    f"{w.name}: each {inf.gpus_per_replica}-GPU replica spans "
                    f"{inf.nodes_per_replica} nodes (tensor/pipeline parallel between nodes)"
                )
            else:
                local.append(
                    f"{w.name}: {inf.replicas} replicas of {inf.gpus_per_replica} GPUs, each "
                    f"inside one {g}-GPU node (tensor parallel over NVLink)"
                )
        elif w.hpc and nodes > 1 and (coupled[i] if i < len(coupled) else True):
            spans.append(f"{w.name}: one coupled run over {nodes} nodes (MPI between nodes)")
        elif w.hpc:
            local.append(
                f"{w.name}: independent tasks of one node each"
                if nodes > 1
                else f"{w.name} runs on one node"
            )
        elif nodes > 1:
            spans.append(f"{w.name}: {nodes} nodes of unknown parallelism, planned as multi-node")
        else:
            local.append(f"{w.name} fits one node")
    if spans:
        return True, "traffic between nodes: " + "; ".join(spans)
    return False, (
        "no workload spans nodes (" + "; ".join(local) + "): no compute (east-west) fabric; "
        "the storage and in-band (front-end) networks remain"
    )
