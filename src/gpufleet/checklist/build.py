"""Build the checklist from a plan (`gpufleet plan --json`) and the evidence supplied: an
inventory (`gpufleet inventory --json`), validation results (`gpufleet validate --out`) and
readiness reports (`gpufleet doctor --json`). Items a file proves are done with the evidence;
the rest stay open. The site, racking and cabling items carry the plan's numbers and stay open:
no file here proves a circuit or a cable."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpufleet.checklist.inputs import chosen_candidate
from gpufleet.checklist.model import Checklist, Section
from gpufleet.plan.facility import FLOOR_RATING_KG_M2
from gpufleet.validate.suite import TESTS

Doc = dict[str, Any]


def _obj(doc: Doc, key: str) -> Doc:
    """``doc[key]`` when it is an object, else empty: a hand-edited file never crashes."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _list(doc: Doc, key: str) -> list[Any]:
    value = doc.get(key)
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _num(value: Any, digits: int = 0) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    return f"{value:,.{digits}f}"


def build_checklist(
    plan: Doc,
    inventory: Doc | None = None,
    validations: list[tuple[str, Doc]] | None = None,
    doctors: list[tuple[str, Doc]] | None = None,
    where: str = "--plan",
) -> Checklist:
    """The checklist of ``plan``; ``validations`` and ``doctors`` are (file name, document)."""
    cand = chosen_candidate(plan, where)
    want = _int(cand.get("servers"))
    validations = validations or []
    doctors = doctors or []
    sections = [
        _site(cand),
        _racking(cand),
        _cabling(cand),
        _baseline(cand, inventory),
        _software(doctors, want),
        _readiness(doctors, inventory),
        _validation(validations, want),
    ]
    sources = [where] + (["inventory"] if inventory else [])
    sources += [n for n, _ in validations] + [n for n, _ in doctors]
    return Checklist(name=str(plan.get("name") or "plan"), sections=sections, sources=sources)


def _site(cand: Doc) -> Section:
    f = _obj(cand, "facility")
    s = Section("site", "Site: power, UPS, cooling, floor")
    s.add(
        "power",
        f"Power: {f.get('racks', '?')} racks at {_num(f.get('rack_load_kw'), 1)} kW each, "
        f"{f.get('circuits_per_rack', '?')} circuits of {_num(f.get('circuit_kw'), 1)} kW per "
        f"rack, {f.get('pdus', '?')} PDUs, {f.get('redundancy', '?')} feeds; IT load "
        f"{_num(f.get('it_kw'), 1)} kW, facility {_num(f.get('facility_kw'), 1)} kW",
    )
    plant = _obj(cand, "plant")  # the planner's UPS, generators and cooling plant
    if plant.get("ups_kva") is not None:
        s.add(
            "ups",
            f"UPS: {plant.get('ups_systems', '?')} system(s), {_num(plant.get('ups_kva'), 0)} kVA "
            f"for {_num(plant.get('ups_load_kw'), 1)} kW ({_num(plant.get('ups_installed_kva'), 0)}"
            f" kVA installed), {_num((plant.get('ups_runtime_s') or 0) / 60, 0)} min on "
            f"{plant.get('ups_battery', '?')} batteries ({_num(plant.get('battery_kwh'), 0)} kWh)",
        )
        if plant.get("generators"):
            s.add(
                "generator",
                f"Generators: {plant['generators']} x {_num(plant.get('generator_unit_kw'), 0)} "
                f"kW for {_num(plant.get('generator_kva'), 0)} kVA",
            )
        if plant.get("cdus"):
            s.add(
                "cdu",
                f"Liquid cooling: {plant['cdus']} CDU(s) for {_num(plant.get('liquid_kw'), 1)} kW, "
                f"{_num(plant.get('coolant_l_per_min'), 0)} L/min of coolant",
            )
    elif ups := {k: v for k, v in f.items() if k.startswith(("ups", "generator"))}:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(ups.items()))
        s.add("ups", f"UPS and generator: {shown}")
    else:
        s.add(
            "ups",
            f"UPS sized for the IT load of {_num(f.get('it_kw'), 1)} kW and the runtime the site "
            "needs (the plan gives no UPS figure)",
        )
    s.add(
        "cooling",
        f"Cooling ({f.get('cooling', '?')}): {_num(f.get('heat_load_kw'), 1)} kW of heat, "
        f"{_num(f.get('heat_load_tons'), 1)} tons, PUE {f.get('pue', '?')}",
    )
    s.add("floor", _floor_text(f))
    return s


def _floor_text(f: Doc) -> str:
    """The fullest rack's weight and floor loading as the planner prints them (kg, kg/m^2 against
    the rating: ANSI/TIA-942's unless the spec set its own), "not known" without a weight."""
    rating = f.get("floor_rating_kg_m2")
    if not isinstance(rating, (int, float)):
        rating = FLOOR_RATING_KG_M2
    source = (
        "ANSI/TIA-942's 12 kPa"
        if rating == FLOOR_RATING_KG_M2
        else "the spec's constraints.floor_rating_kg_m2"
    )
    rated = f"floor rating {_num(rating)} kg/m^2 ({source})"
    if "rack_weight_kg" not in f and "floor_load_kg_m2" not in f:  # a plan from before weights
        return (
            f"Floor load: {f.get('racks', '?')} racks of {f.get('servers_per_rack', '?')} "
            f"servers within the {rated} (the plan gives no rack weight: use the vendor's)"
        )
    kg, load = f.get("rack_weight_kg"), f.get("floor_load_kg_m2")
    if not isinstance(kg, (int, float)) or not isinstance(load, (int, float)):
        note = f.get("weight_note")
        why = f" ({note})" if isinstance(note, str) and note else ""
        return (
            f"Floor load: rack weight and floor loading not known{why}; check the vendor's "
            f"weights against the {rated}"
        )
    area = f.get("rack_footprint_m2")
    over = f" over {_num(area, 2)} m^2" if isinstance(area, (int, float)) else ""
    verdict = "EXCEEDS" if load > rating else "within"
    n = f.get("servers_per_rack", "?")
    return (
        f"Floor load: {_num(kg, 1)} kg per full rack ({n} server{'' if n == 1 else 's'}), "
        f"{_num(load)} kg/m^2{over}, {verdict} the {rated}"
    )


def _racking(cand: Doc) -> Section:
    f = _obj(cand, "facility")
    server = _obj(cand, "server")
    s = Section("racking", "Racking")
    elevations = cand.get("elevations") or cand.get("rack_elevations")
    if isinstance(elevations, list) and elevations:
        for i, rack in enumerate(elevations):
            name = (
                rack.get("rack", rack.get("name", f"rack {i + 1}")) if isinstance(rack, dict) else i
            )
            s.add(f"rack_{i}", f"Rack {name} built as its elevation drawing")
    else:
        s.add(
            "servers",
            f"{cand.get('servers', '?')} x {server.get('name', '?')} "
            f"({server.get('rack_units', '?')} U) in {f.get('racks', '?')} racks, "
            f"{f.get('servers_per_rack', '?')} per rack (limited by "
            f"{f.get('servers_per_rack_limited_by', '?')})",
        )
    return s


def _cabling(cand: Doc) -> Section:
    fabric = _obj(cand, "fabric")
    s = Section("cabling", "Cabling and fabric")
    for net in ("compute", "storage", "inband"):
        n = _obj(fabric, net)
        if n:
            s.add(
                f"{net}_switches",
                f"{net} fabric: {n.get('leaves', '?')} leaves, {n.get('spines', '?')} spines, "
                f"{n.get('cores', 0) or 'no'} cores; {n.get('endpoint_links', '?')} node links, "
                f"{n.get('leaf_spine_links', '?')} leaf-spine links",
            )
    for i, c in enumerate(_list(fabric, "cables")):
        if not isinstance(c, dict):
            continue
        optic = f", {c.get('transceivers')} x {c['transceiver']}" if c.get("transceiver") else ""
        fibre = f", {c['fibre']}" if c.get("fibre") else ""
        s.add(
            f"cable_{i}",
            f"{c.get('network', '?')} {c.get('tier', '?')}: {c.get('count', '?')} x "
            f"{c.get('medium', '?')} {_num(c.get('length_m'))} m{optic}{fibre}, labelled and "
            "tested",
        )
    if "oob_switches" in fabric:
        s.add(
            "oob",
            f"Out-of-band: {fabric['oob_switches']} switches, {fabric.get('oob_links', '?')} links",
        )
    return s


def _baseline(cand: Doc, inventory: Doc | None) -> Section:
    s = Section("baseline", "Firmware and driver baseline")
    server = _obj(cand, "server")
    want_nodes = _int(cand.get("servers"))
    per_node = _int(server.get("gpus"))
    nodes = [n for n in _list(inventory or {}, "nodes") if isinstance(n, dict)]
    if not nodes:
        s.add("inventory", f"Inventory of all {want_nodes} nodes (gpufleet inventory --json)")
        s.add("driver", "One driver version on every node")
        s.add("vbios", "One VBIOS and InfoROM version per GPU model")
        return s
    gpus = [g for n in nodes for g in _list(n, "gpus") if isinstance(g, dict)]
    short = [n.get("name") for n in nodes if per_node and len(_list(n, "gpus")) != per_node]
    state = "failed" if short else "done" if len(nodes) >= want_nodes else "open"
    s.add(
        "inventory",
        f"Inventory of all {want_nodes} nodes, {per_node} GPUs each",
        state,
        f"inventory: {len(nodes)} nodes, {len(gpus)} GPUs"
        + (f"; wrong GPU count on {', '.join(map(str, short[:5]))}" if short else ""),
    )
    for key, field, text in (
        ("driver", "driver_version", "One driver version on every node"),
        ("vbios", "vbios_version", "One VBIOS version per GPU model"),
        ("inforom", "inforom_version", "One InfoROM version per GPU model"),
    ):
        seen: dict[str, Counter[str]] = {}
        for g in gpus:
            seen.setdefault(str(g.get("model") or g.get("name")), Counter())[str(g.get(field))] += 1
        mixed = {m: c for m, c in seen.items() if len(c) > 1 or "None" in c}
        if mixed:
            shown = "; ".join(f"{m}: {dict(c)}" for m, c in mixed.items())
            s.add(key, text, "failed", f"inventory: {shown}")
        else:
            shown = ", ".join(f"{m} {next(iter(c))}" for m, c in seen.items())
            state, cover = _covered("done", len(nodes), want_nodes)
            s.add(key, text, state, f"inventory: {shown}{cover}")
    return s


SOFTWARE = (
    ("driver", "NVIDIA driver loaded, nouveau off, persistence daemon, fabric manager"),
    ("cuda", "CUDA releases the site uses run on the driver"),
    ("containers", "NVIDIA Container Toolkit and the container runtime"),
    ("gpudirect", "GPUDirect RDMA: nvidia-peermem, ACS off, IOMMU pass-through"),
    ("network", "InfiniBand/RoCE ports active at the planned rate"),
    ("host", "CPU governor, NUMA balancing, host memory"),
)


def _checks(doc: Doc) -> list[Doc]:
    checks = _list(_obj(doc, "readiness"), "checks")
    return [c for c in checks if isinstance(c, dict)]


def _covered(state: str, nodes: int, want: int) -> tuple[str, str]:
    """A "done" proven on fewer nodes than the plan has stays open; the suffix says how many."""
    if state == "done" and nodes < want:
        return "open", f" ({nodes} of {want} nodes)"
    return state, f" ({nodes} of {want} nodes)" if want else ""


def _software(doctors: list[tuple[str, Doc]], want: int) -> Section:
    s = Section("software", "Software stack")
    for phase, text in SOFTWARE:
        per = [(n, [c for c in _checks(d) if c.get("phase") == phase]) for n, d in doctors]
        per = [(n, cs) for n, cs in per if cs]
        if not per:
            s.add(phase, text)
            continue
        bad = [
            f"{n}: {c.get('name')} {c.get('status')}"
            for n, cs in per
            for c in cs
            if c.get("status") not in ("ok", "skip")
        ]
        state = "failed" if any(" fail" in b for b in bad) else "warn" if bad else "done"
        state, cover = _covered(state, len(per), want)
        evidence = "; ".join(bad[:4]) if bad else "doctor: ok"
        s.add(phase, text, state, evidence + cover)
    return s


def _readiness(doctors: list[tuple[str, Doc]], inventory: Doc | None) -> Section:
    s = Section("readiness", "Readiness per node (gpufleet doctor)")
    seen: set[str] = set()
    for name, doc in doctors:
        node = str(_obj(doc, "readiness").get("node") or name)
        seen.add(node)
        checks = _checks(doc)
        if not checks:
            s.add(node, f"Node {node}: readiness checks", "open", f"{name}: no readiness section")
            continue
        bad = [c for c in checks if c.get("status") not in ("ok", "skip")]
        worst = {str(c.get("status")) for c in bad}
        state = "failed" if "fail" in worst else "warn" if bad else "done"
        shown = "; ".join(f"{c.get('phase')}/{c.get('name')}: {c.get('detail')}" for c in bad[:3])
        s.add(node, f"Node {node}: readiness checks", state, f"{name}: {shown or 'all ok'}")
    for n in _list(inventory or {}, "nodes"):
        listed = str(n.get("name")) if isinstance(n, dict) else ""
        if listed and listed not in seen:
            s.add(listed, f"Node {listed}: readiness checks (gpufleet doctor --json)")
    if not s.items:
        s.add("all", "Every node: gpufleet doctor --json exits 0")
    return s


def _validation(validations: list[tuple[str, Doc]], want: int) -> Section:
    s = Section("validation", "Validation levels (gpufleet validate)")
    names = {1: "software and health", 2: "bandwidth, memory, matmul", 3: "stress, power, NCCL"}
    for level in (1, 2, 3):
        tests = {n for n, t in TESTS.items() if t.level == level}
        results = [
            (fname, r)
            for fname, doc in validations
            for r in _list(doc, "results")
            if isinstance(r, dict) and isinstance(r.get("test"), str) and r["test"] in tests
        ]
        text = f"Level {level}: {names[level]}"
        if not results:
            s.add(f"level{level}", text)
            continue
        statuses = Counter(str(r.get("status")) for _, r in results)
        nodes = {str(r.get("node")) for _, r in results}
        missing = sorted(
            n for n in tests if not TESTS[n].multi_node and n not in {r["test"] for _, r in results}
        )
        state = "failed" if statuses["fail"] else "warn" if statuses["warn"] else "done"
        if state == "done" and missing:
            state = "open"  # a partial run proves only part of the level
            statuses["missing: " + ", ".join(missing)] = 0
        state, _ = _covered(state, len(nodes), want)
        files = sorted({f for f, _ in results})
        counts = ", ".join(f"{v} {k}" if v else k for k, v in sorted(statuses.items()))
        figures = _figures([r for _, r in results])
        s.add(
            f"level{level}",
            text,
            state,
            f"{', '.join(files)}: {len(nodes)} of {want} node(s), {counts}"
            + (f"; {figures}" if figures else ""),
        )
    return s


def _figures(results: list[Doc]) -> str:
    """The lowest measured value of each metric, against its expected value."""
    low: dict[str, tuple[float, str, Any]] = {}
    for r in results:
        for m in _list(r, "metrics"):
            if not isinstance(m, dict) or not isinstance(m.get("value"), (int, float)):
                continue
            key = f"{r.get('test')} {m.get('name')}"
            if key not in low or m["value"] < low[key][0]:
                low[key] = (float(m["value"]), str(m.get("unit") or ""), m.get("expected"))
    parts = []
    for key, (value, unit, expected) in list(low.items())[:6]:
        exp = f" (expected {expected:g})" if isinstance(expected, (int, float)) else ""
        parts.append(f"{key} min {value:.4g} {unit}{exp}")
    return "; ".join(parts)
