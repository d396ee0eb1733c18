"""Bill of materials: servers, switches by tier, cables and transceivers by type and length, PDUs,
racks, shared storage, UPS, generators and CDUs. Pure: rows in, CSV text out; the CLI writes the
file."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.plan.csvtext import csv_table, num
from gpufleet.plan.planner import CandidatePlan

__all__ = ["BomRow", "bom_csv", "bom_rows"]

BOM_COLUMNS = ("category", "item", "detail", "length_m", "quantity")


@dataclass(frozen=True)
class BomRow:
    """One line of the bill of materials."""

    category: str
    item: str
    detail: str
    length_m: float | None
    quantity: int


def bom_rows(cp: CandidatePlan) -> list[BomRow]:
    """The bill of materials of one feasible candidate plan."""
    if not cp.feasible or cp.facility is None or cp.fabric is None:
        return []
    f, fab = cp.facility, cp.fabric
    rows = [
        BomRow(
            "server",
            cp.server.name,
            f"{cp.server.gpus} x {cp.server.gpu_name}, "
            f"{cp.server.power_kw:g} kW, {cp.server.rack_units}U",
            None,
            cp.servers,
        ),
        BomRow(
            "rack",
            "rack",
            f"{f.servers_per_rack} servers, {f.rack_load_kw:g} kW max, {f.cooling} cooled"
            + (f", {f.rack_weight_kg:,.0f} kg loaded" if f.rack_weight_kg is not None else ""),
            None,
            f.racks,
        ),
        BomRow("power", "PDU", f"{f.circuit_kw:.1f} kW circuit each, {f.redundancy}", None, f.pdus),
    ]
    if cp.management_nodes:
        rows.append(
            BomRow(
                "server",
                "management node",
                "head node / UFM appliance, 1U, in-band + out-of-band ports",
                None,
                cp.management_nodes,
            )
        )
    for net, tree in (("compute", fab.compute), ("storage", fab.storage), ("in-band", fab.inband)):
        for tier, n in (("leaf", tree.leaves), ("spine", tree.spines), ("core", tree.cores)):
            if n:
                rows.append(
                    BomRow(
                        "switch",
                        f"{net} {tier} switch",
                        f"{tree.radix}-port {fab.port_gbps}G",
                        None,
                        n,
                    )
                )
    if fab.oob_switches:
        rows.append(BomRow("switch", "out-of-band switch", "48-port 1GbE", None, fab.oob_switches))
    xcvr: dict[str, int] = {}
    for c in fab.cables:
        rows.append(
            BomRow("cable", f"{c.network} {c.tier} {c.medium}", c.fibre or "", c.length_m, c.count)
        )
        if c.transceiver:
            xcvr[c.transceiver] = xcvr.get(c.transceiver, 0) + c.transceivers
    for kind, n in sorted(xcvr.items()):
        rows.append(BomRow("transceiver", kind, "two per optical link", None, n))
    s = cp.storage
    if s is not None and s.parallel_fs_recommended:
        rows.append(
            BomRow(
                "storage",
                "parallel file system",
                f"{s.capacity_bytes / 1e12:,.0f} TB usable, write "
                f"{s.checkpoint_write_bytes_per_s / 1e9:.1f} GB/s, read "
                f"{s.dataset_read_bytes_per_s / 1e9:.2f} GB/s",
                None,
                1,
            )
        )
    p = cp.plant
    if p is not None:
        rows.append(
            BomRow(
                "power",
                "UPS",
                f"{p.ups_kva:,.0f} kVA each, {p.ups_runtime_s / 60:g} min, {p.ups_battery}, "
                f"{p.battery_kwh:,.1f} kWh at the DC bus",
                None,
                p.ups_systems,
            )
        )
        if p.generators:
            rows.append(
                BomRow(
                    "power",
                    "standby generator",
                    f"{p.generator_unit_kw:,.0f} kW standby "
                    f"({p.generator_unit_kw / 0.8:,.0f} kVA at 0.8 pf), {p.generator_unit_basis}",
                    None,
                    p.generators,
                )
            )
        if p.cdus:
            rows.append(
                BomRow(
                    "cooling",
                    "coolant distribution unit",
                    f"{p.cdu_capacity_kw:,.0f} kW each (N+1), "
                    f"{p.coolant_l_per_min:,.0f} L/min total",
                    None,
                    p.cdus,
                )
            )
    return rows


def bom_csv(rows: list[BomRow]) -> str:
    """CSV text with a header row."""
    return csv_table(
        BOM_COLUMNS, rows, lambda r: (r.category, r.item, r.detail, num(r.length_m), r.quantity)
    )
