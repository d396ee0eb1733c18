"""Cable map: every cable of the plan, device/port to device/port, with type, length and optic.

Built from the same trees and layout as the fabric's cable lines, so counts per network and tier
equal the fabric's link counts and counts per stock length equal the bill of materials. Port
numbering (rail-optimized, radix k): a leaf's ports 1..k/2 face nodes (node n of its group on port
n), k/2+1..k face spines; a spine takes each leaf's links on consecutive ports. Three levels: each
leaf links once to every aggregation switch of its pod, aggregation uplinks go round-robin to the
cores. Management (UFM) links on the compute fabric take the node slot after the last node
(link j on rail j mod ports-per-node; DGX SuperPOD RA: one node's slot goes to UFM), from
``mgmt001``... port ``ib1``... in turn. Node-to-leaf lengths are per rack (``rack_run``);
switch-to-switch lengths are the fabric's stock lengths taken in order (the row-by-row split of
the BOM). Pure: rows in, CSV text out.

Optic parts (NVIDIA LinkX, "LinkX User Guide for 400Gbps 100G-PAM4 OSFP & QSFP112-based Cables
and Transceivers", docs.nvidia.com/networking/display/400g100gpam4ovpub): 400G SR4 multimode 50 m
is MMA4Z00-NS400 (single-port flat-top OSFP, adapters) and MMA4Z00-NS (twin-port finned OSFP,
switches); 500 m single-mode is MMS4X00-NM (twin-port 2xDR4); 2 km is MMS4X50-NM (twin-port
2xFR4). A twin-port switch optic serves two links, so a switch needs half as many as its optical
ports; the BOM still counts one transceiver per cable end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpufleet.plan.csvtext import csv_table
from gpufleet.plan.fabric import (
    OOB_SWITCH_PORTS,
    Fabric,
    FatTree,
    Layout,
    cable_class,
    node_rack,
    rack_run,
)

__all__ = ["CABLE_COLUMNS", "Cable", "cable_map", "cable_map_csv"]

CABLE_COLUMNS = (
    "network",
    "tier",
    "a_device",
    "a_port",
    "b_device",
    "b_port",
    "medium",
    "length_m",
    "length_class",
    "optic",
    "optic_part",
    "fibre",
)
OPTIC_PARTS = {
    "400G SR4": "MMA4Z00-NS400 (adapter) / MMA4Z00-NS (switch, twin-port)",
    "400G DR4": "MMS4X00-NM (twin-port 2xDR4, 500 m)",
    "400G FR4": "MMS4X50-NM (twin-port 2xFR4, 2 km)",
}
_CLASS = {"DAC": "DAC <= 3 m", "MM optics": "multimode <= 50 m"}
_PORT = {"compute": "nic", "storage": "snic", "in-band": "inband"}


@dataclass(frozen=True)
class Cable:
    """One cable: its two ends, medium, stock length, reach class and optic part per end."""

    network: str
    tier: str
    a_device: str
    a_port: str
    b_device: str
    b_port: str
    medium: str
    length_m: float
    length_class: str
    optic: str
    fibre: str

    @property
    def optic_part(self) -> str:
        return OPTIC_PARTS.get(self.optic, "-")


def _cable(net: str, tier: str, a: str, ap: str, b: str, bp: str, length: float) -> Cable:
    medium, xcvr, fibre = cable_class(length)
    cls = _CLASS.get(medium) or ("single-mode <= 500 m" if length <= 500 else "single-mode <= 2 km")
    return Cable(net, tier, a, ap, b, bp, medium, length, cls, xcvr or "-", fibre or "-")


def node_name(i: int, servers: int | None = None) -> str:
    """``node00001``...; past ``servers``, management nodes ``mgmt001``..."""
    if servers is not None and i >= servers:
        return f"mgmt{i - servers + 1:03d}"
    return f"node{i + 1:05d}"


def _lengths(fab: Fabric, net: str, tier: str) -> Iterator[float]:
    for line in fab.cables:
        if line.network == net and line.tier == tier:
            for _ in range(line.count):
                yield line.length_m


def _management_ends(
    tree: FatTree, fab: Fabric, layout: Layout
) -> Iterator[tuple[int, int, int, float]]:
    """(slot, rail, management node, run) of each management link on the compute tree."""
    m = max(fab.management_nodes, 1)
    for j in range(tree.management_links):
        mgmt = fab.servers + j % m
        run = rack_run(layout, node_rack(layout, mgmt))
        yield tree.nodes + j // tree.ports_per_node, j % tree.ports_per_node, mgmt, run


def _tree(net: str, tree: FatTree, fab: Fabric, layout: Layout) -> Iterator[Cable]:
    k, half, ppn = tree.radix, tree.radix // 2, tree.ports_per_node
    port = _PORT[net]
    if tree.levels == 0:
        return
    servers = fab.servers  # compute nodes; in-band also holds management nodes past them
    m = max(fab.management_nodes, 1)
    mgmt_ends = list(_management_ends(tree, fab, layout))
    if tree.levels == 1:
        for i in range(tree.nodes):
            run = rack_run(layout, node_rack(layout, i))
            for r in range(ppn):
                yield _cable(
                    net,
                    "node-leaf",
                    node_name(i, servers),
                    f"{port}{r + 1}",
                    f"{net}-leaf001",
                    str(i * ppn + r + 1),
                    run,
                )
        for j, (_, _, mgmt, run) in enumerate(mgmt_ends):
            name, p = node_name(mgmt, servers), f"ib{j // m + 1}"
            yield _cable(
                net, "node-leaf", name, p, f"{net}-leaf001", str(tree.nodes * ppn + j + 1), run
            )
        return
    groups = -(-(tree.nodes + tree.management_slots) // half)
    for i in range(tree.nodes):
        run = rack_run(layout, node_rack(layout, i))
        for r in range(ppn):
            leaf = r * groups + i // half
            yield _cable(
                net,
                "node-leaf",
                node_name(i, servers),
                f"{port}{r + 1}",
                f"{net}-leaf{leaf + 1:03d}",
                str(i % half + 1),
                run,
            )
    for j, (slot, r, mgmt, run) in enumerate(mgmt_ends):
        leaf = r * groups + slot // half
        name, p = node_name(mgmt, servers), f"ib{j // m + 1}"
        yield _cable(
            net, "node-leaf", name, p, f"{net}-leaf{leaf + 1:03d}", str(slot % half + 1), run
        )
    up = _lengths(fab, net, "leaf-spine")
    if tree.levels == 2:
        per = half // tree.spines
        for leaf in range(tree.leaves):
            for j in range(half):
                yield _cable(
                    net,
                    "leaf-spine",
                    f"{net}-leaf{leaf + 1:03d}",
                    str(half + j + 1),
                    f"{net}-spine{j // per + 1:03d}",
                    str(leaf * per + j % per + 1),
                    next(up),
                )
        return
    for pod_start in range(0, tree.leaves, half):  # three levels: pods of half leaves + aggs
        m = min(half, tree.leaves - pod_start)
        for q in range(m * half):
            leaf, j = pod_start + q // half, q % half
            agg = pod_start + q % m
            yield _cable(
                net,
                "leaf-spine",
                f"{net}-leaf{leaf + 1:03d}",
                str(half + j + 1),
                f"{net}-spine{agg + 1:03d}",
                str(q // m + 1),
                next(up),
            )
    core_runs = _lengths(fab, net, "spine-core")
    for q in range(tree.spine_core_links):
        agg, j = q // half, q % half
        yield _cable(
            net,
            "spine-core",
            f"{net}-spine{agg + 1:03d}",
            str(half + j + 1),
            f"{net}-core{q % tree.cores + 1:03d}",
            str(q // tree.cores + 1),
            next(core_runs),
        )
    assert k >= half


def cable_map(fab: Fabric, layout: Layout, pdus: int) -> list[Cable]:
    """Every cable of ``fab`` laid out as ``layout``; ``pdus`` PDUs on the out-of-band network."""
    out: list[Cable] = []
    for net, tree in (("compute", fab.compute), ("storage", fab.storage), ("in-band", fab.inband)):
        out.extend(_tree(net, tree, fab, layout))
    nodes = fab.servers + fab.management_nodes
    ends: list[tuple[str, str]] = [(node_name(i, fab.servers), "bmc") for i in range(nodes)]
    racks = max(layout.racks, 1)
    ends += [(f"rack{i % racks + 1:03d}-pdu{i // racks + 1}", "mgmt") for i in range(pdus)]
    for net, tree in (("compute", fab.compute), ("storage", fab.storage), ("in-band", fab.inband)):
        for tier, n in (("leaf", tree.leaves), ("spine", tree.spines), ("core", tree.cores)):
            ends += [(f"{net}-{tier}{j + 1:03d}", "mgmt") for j in range(n)]
    for idx, (dev, p) in enumerate(ends[: fab.oob_links]):
        sw, swp = idx // OOB_SWITCH_PORTS + 1, idx % OOB_SWITCH_PORTS + 1
        out.append(
            Cable(
                "out-of-band",
                "node-switch",
                dev,
                p,
                f"oob-sw{sw:03d}",
                str(swp),
                "Cat6 copper",
                3.0,
                "copper <= 100 m",
                "-",
                "-",
            )
        )
    return out


def cable_map_csv(cables: list[Cable]) -> str:
    """CSV text with a header row."""
    return csv_table(CABLE_COLUMNS, cables, _cable_row)


def _cable_row(c: Cable) -> tuple[object, ...]:
    return (
        c.network,
        c.tier,
        c.a_device,
        c.a_port,
        c.b_device,
        c.b_port,
        c.medium,
        f"{c.length_m:g}",
        c.length_class,
        c.optic,
        c.optic_part,
        c.fibre,
    )
