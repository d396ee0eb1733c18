"""Sections of the HTML report for the site plant, shared storage and rack elevations.

Kept apart from ``report_html`` (charts, money, network) so each module has one job; every
section is inline HTML/SVG, no scripts. Elevations: one drawing per distinct rack configuration,
named with the racks it applies to (compute racks bottom-up, the reserved top units for the
out-of-band switch and patch panels; a leaf rack per row; spine/core racks in the central row,
16 one-U switches each, as the fabric's cable lengths assume).
"""

from __future__ import annotations

from html import escape

from gpufleet.plan.planner import CandidatePlan

__all__ = [
    "elevation_svg",
    "elevations_section",
    "fabric_need_section",
    "plant_section",
    "storage_section",
]

_U_PX = 9
_KINDS = {"server": "#3a6", "switch": "#37a", "reserved": "#ccc", "empty": "#fff"}


def _rows(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def plant_section(cp: CandidatePlan) -> str:
    """UPS, generators, liquid and air cooling."""
    p = cp.plant
    if p is None:
        return ""
    rows = [
        [
            "UPS",
            f"{p.ups_systems} x {p.ups_kva:,.0f} kVA ({p.ups_load_kw:,.0f} kW IT at pf 0.9), "
            f"{p.ups_installed_kva:,.0f} kVA installed",
        ],
        [
            "battery",
            f"{p.ups_runtime_s / 60:g} min runtime, {p.battery_kwh:,.1f} kWh at the DC bus "
            f"({p.ups_battery})",
        ],
        [
            "generators",
            f"{p.generators} x {p.generator_unit_kw:,.0f} kW for {p.generator_kva:,.0f} kVA "
            f"(facility load at pf 0.8); {p.generator_unit_basis}, each at most "
            f"{p.generator_loading:.0%} loaded ({p.generator_required_kw:,.1f} kW of rating "
            "needed)",
        ],
    ]
    if p.generator_note:
        rows.append(["site backup", p.generator_note])
    if p.cdus:
        rows.append(
            [
                "liquid cooling",
                f"{p.liquid_kw:,.0f} kW: {p.cdus} CDUs of {p.cdu_capacity_kw:,.0f} kW (N+1), "
                f"{p.coolant_l_per_min:,.0f} L/min ({p.coolant_l_per_min_per_kw:.2f} L/min per kW)",
            ]
        )
    rows.append(
        [
            "air cooling",
            f"{p.air_kw:,.0f} kW: {p.airflow_m3_per_h:,.0f} m3/h ({p.airflow_cfm:,.0f} CFM)",
        ]
    )
    return "<h2>UPS, generators and cooling plant</h2>" + _rows(["item", "value"], rows)


def storage_section(cp: CandidatePlan) -> str:
    """Shared storage: parallel file system or not, and why."""
    s = cp.storage
    if s is None:
        return ""
    head = [
        ["parallel file system", "recommended" if s.parallel_fs_recommended else "not needed"],
        ["why", s.reason],
    ]
    for io in s.workloads:
        if io.kind == "hpc":
            rate = "unknown" if io.read_bytes_per_s is None else _gbs(io.read_bytes_per_s)
            head.append([f"{io.name} input read", f"{rate} ({io.nodes} nodes)"])
    if not s.checkpoint_bytes:
        if s.hpc_read_bytes_per_s is not None:
            head.append(["capacity", f"{s.capacity_bytes / 1e12:,.1f} TB of inputs"])
        return "<h2>Shared storage</h2>" + _rows(["item", "value"], head)
    rows = [
        *head,
        [
            "capacity",
            f"{s.capacity_bytes / 1e12:,.1f} TB ({s.checkpoints_kept} checkpoints "
            f"of {s.checkpoint_bytes / 1e12:,.2f} TB + dataset {s.dataset_bytes / 1e12:,.1f} TB)",
        ],
        ["checkpoint write", f"{s.checkpoint_write_bytes_per_s / 1e9:,.2f} GB/s"],
        ["dataset read", f"{s.dataset_read_bytes_per_s / 1e9:,.3f} GB/s"],
        ["local NVMe per node", f"{s.local_nvme_needed_bytes_per_node / 1e12:,.2f} TB needed"],
    ]
    return "<h2>Shared storage</h2>" + _rows(["item", "value"], rows)


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:,.2f} GB/s"


def fabric_need_section(cp: CandidatePlan) -> str:
    """Why the plan has (or lacks) a compute fabric, and where management nodes sit on it."""
    fab = cp.fabric
    if fab is None or not (fab.compute_reason or fab.management_reason):
        return ""
    rows = [["compute (east-west) fabric", fab.compute_reason or "-"]]
    if fab.compute.management_links:
        rows.append(
            [
                "management nodes on the compute fabric",
                f"{fab.compute.management_links} UFM links of "
                f"{fab.compute.endpoint_links} node-leaf cables",
            ]
        )
    if fab.management_reason:
        rows.append(["management", fab.management_reason])
    return _rows(["item", "value"], rows)


def elevation_svg(title: str, units: int, items: list[tuple[int, int, str, str]]) -> str:
    """A rack of ``units`` U; ``items`` are (lowest U, height U, label, kind), U counted from 1.

    Returned as a captioned figure (the caption wraps; the SVG carries it as its label)."""
    h = units * _U_PX
    parts = [
        '<figure style="display:inline-block;width:250px;vertical-align:top;margin:0 1em 1em 0">'
        f'<figcaption style="font-size:.8em;font-weight:bold">{escape(title)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="250" height="{h + 10}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<rect x="30" y="5" width="200" height="{h}" fill="none" stroke="#444"/>'
    ]
    for u in range(1, units + 1, 5):
        parts.append(f'<text x="2" y="{5 + h - (u - 1) * _U_PX - 1}" font-size="8">U{u}</text>')
    for low, height, label, kind in items:
        y = 5 + h - (low - 1 + height) * _U_PX
        parts.append(
            f'<rect x="31" y="{y}" width="198" height="{height * _U_PX - 1}" '
            f'fill="{_KINDS[kind]}" stroke="#666"><title>{escape(label)}</title></rect>'
        )
        if height * _U_PX >= 9:
            parts.append(
                f'<text x="36" y="{y + min(height * _U_PX, 12) - 2}" font-size="8">'
                f"{escape(label[:40])}</text>"
            )
    parts.append("</svg></figure>")
    return "".join(parts)


def _ranges(ids: list[int]) -> str:
    out, start = [], ids[0]
    for a, b in zip(ids, [*ids[1:], None], strict=True):
        if b != a + 1:
            out.append(f"rack{start + 1:03d}" + (f"-rack{a + 1:03d}" if a != start else ""))
            if b is not None:
                start = b
    return ", ".join(out)


def elevations_section(cp: CandidatePlan) -> str:
    """One elevation per distinct rack configuration, with the racks it applies to."""
    f, fab = cp.facility, cp.fabric
    if f is None or fab is None or not f.racks:
        return ""
    configs: dict[int, list[int]] = {}
    left = cp.servers
    for rack in range(f.racks):
        n = min(f.servers_per_rack, left)
        left -= n
        configs.setdefault(n, []).append(rack)
    svgs = []
    for n, racks in configs.items():
        items = [
            (1 + i * f.server_ru, f.server_ru, f"{cp.server.name} #{i + 1}", "server")
            for i in range(n)
        ]
        top = f.rack_units - (f.rack_units - f.usable_ru) + 1
        items.append((top, 1, "out-of-band switch (1GbE)", "switch"))
        if f.rack_units - f.usable_ru > 1:
            items.append((top + 1, f.rack_units - f.usable_ru - 1, "patch panels", "reserved"))
        svgs.append(elevation_svg(f"{_ranges(racks)}: {n} servers", f.rack_units, items))
    layout = cp.layout
    rows = layout.rows if layout else 1
    leaves = fab.compute.leaves + fab.storage.leaves + fab.inband.leaves
    if leaves and f.racks > 1:
        per_row = -(-leaves // rows)
        shown = min(per_row, f.usable_ru)
        items = [(1 + i, 1, f"leaf switch {i + 1}", "switch") for i in range(shown)]
        svgs.append(
            elevation_svg(
                f"leaf rack, one per row ({rows} row{'s' if rows > 1 else ''}, {per_row} leaves)",
                f.rack_units,
                items,
            )
        )
    upper = sum(t.spines + t.cores for t in (fab.compute, fab.storage, fab.inband))
    if upper:
        racks_n = -(-upper // 16)
        items = [
            (1 + 2 * i, 1, f"spine/core switch {i + 1}", "switch") for i in range(min(upper, 16))
        ]
        svgs.append(
            elevation_svg(
                f"spine rack x {racks_n}, {upper} switches (central row)", f.rack_units, items
            )
        )
    if cp.management_nodes:
        m = cp.management_nodes
        racks_m = -(-m // f.usable_ru)
        items = [
            (1 + i, 1, f"management node {i + 1}", "server") for i in range(min(m, f.usable_ru))
        ]
        svgs.append(
            elevation_svg(f"management rack x {racks_m}, {m} head/UFM nodes", f.rack_units, items)
        )
    return (
        "<h2>Rack elevations</h2><p>PDUs are 0U (vertical, at the rack's back): "
        f"{f.circuits_per_rack} per rack.</p>" + "".join(svgs)
    )
