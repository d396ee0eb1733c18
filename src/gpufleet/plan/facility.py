"""Facility: servers per rack, racks, circuits and PDUs with redundancy, power, cooling, energy.

Sources:
- Circuit capacity: V x A x 0.8 (NEC 210.19(A)/215.2(A): continuous loads at most 80 % of the
  breaker rating) x sqrt(3) for three-phase (V line-to-line).
- Cooling: 1 ton of refrigeration = 12,000 BTU/h = 3.517 kW (ASHRAE Handbook, Fundamentals).
- PUE defaults: air 1.5 (Uptime Institute Global Data Center Survey 2023: average ~1.58), liquid
  1.15 (the issue's "liquid cooling at PUE below 1.1" seeds, with a margin); rack power defaults:
  air 20 kW (typical 15-25 kW air-cooled racks), liquid 80 kW. All overridable in the spec.
- Rack weight: the fullest compute rack's servers (catalog ``weight_kg``, e.g. DGX H100 130.45 kg,
  NVIDIA DGX H100 datasheet) plus the empty enclosure (``RACK_TARE_KG``). A server without a
  catalog weight leaves the figure absent (None) with a note, never 0. PDUs, the out-of-band
  switch and cabling have no catalog weight and are not counted (the note says so).
- Floor loading = rack weight / footprint (``rack_width`` x ``rack_depth``, default 600 x 1200 mm:
  APC NetShelter SX AR3300, 600 W x 1200 D mm, 134.09 kg, as in the NetBox device-type library
  rack-types/APC/AR3300.yaml). A uniform load over the footprint: casters and levelling feet
  concentrate it further (the floor vendor's point-load rating governs those). Warned above
  ``FLOOR_RATING_KG_M2``: ANSI/TIA-942 recommends a distributed floor loading capacity of 12 kPa
  (250 lbf/ft^2) for computer rooms (7.2 kPa, 150 lbf/ft^2, minimum); 12 kPa / 9.80665 m/s^2 =
  1,224 kg/m^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.errors import UsageError

__all__ = [
    "DEFAULT_PUE",
    "DEFAULT_RACK_KW",
    "FLOOR_RATING_KG_M2",
    "RACK_TARE_KG",
    "Facility",
    "ImpossibleConstraint",
    "circuit_kw",
    "circuits_per_rack",
    "plan_facility",
    "rack_weight",
]

NEC_CONTINUOUS_DERATING = 0.8
KW_PER_TON = 3.517
HOURS_PER_YEAR = 8760.0
DEFAULT_PUE = {"air": 1.5, "liquid": 1.15}
DEFAULT_RACK_KW = {"air": 20.0, "liquid": 80.0}
RACK_TARE_KG = 134.09  # APC NetShelter SX AR3300 42U 600 x 1200 mm (see the module docstring)
RACK_DEPTH_M = 1.2
FLOOR_RATING_KG_M2 = 1224.0  # ANSI/TIA-942: 12 kPa (250 lbf/ft^2) recommended, / 9.80665


class ImpossibleConstraint(UsageError):
    """A constraint cannot be met by a candidate; the message says what to change."""


def circuit_kw(voltage_v: float, current_a: float, phases: int) -> float:
    """Usable continuous kW of one circuit: V x A x 0.8 (x sqrt(3) when three-phase)."""
    return (
        voltage_v
        * current_a
        * NEC_CONTINUOUS_DERATING
        * (math.sqrt(3) if phases == 3 else 1.0)
        / 1000
    )


def circuits_per_rack(rack_kw: float, per_circuit_kw: float, redundancy: str) -> int:
    """Circuits (one PDU each) to feed ``rack_kw``: N, N+1 or 2N."""
    n = max(1, math.ceil(rack_kw / per_circuit_kw - 1e-9))
    return {"N": n, "N+1": n + 1, "2N": 2 * n}[redundancy]


@dataclass(frozen=True)
class Facility:
    """Racks, power and cooling for the compute servers (plus network switches' power)."""

    rack_limit_kw: float
    servers_per_rack: int
    servers_per_rack_limited_by: str
    racks: int
    rack_load_kw: float
    circuit_kw: float
    circuits_per_rack: int
    pdus: int
    redundancy: str
    cooling: str
    pue: float
    server_kw: float
    servers_it_kw: float
    network_it_kw: float
    it_kw: float
    facility_kw: float
    heat_load_kw: float
    heat_load_tons: float
    cooling_overhead_kw: float
    average_load: float
    annual_mwh: float
    server_ru: int = 0
    usable_ru: int = 38
    rack_units: int = 42
    server_weight_kg: float | None = None
    rack_tare_kg: float = RACK_TARE_KG
    rack_weight_kg: float | None = None
    rack_footprint_m2: float = 0.6 * RACK_DEPTH_M
    floor_load_kg_m2: float | None = None
    floor_rating_kg_m2: float = FLOOR_RATING_KG_M2
    weight_note: str | None = None

    @property
    def floor_overloaded(self) -> bool:
        """The fullest rack's floor loading is above the floor's rating (False when unknown)."""
        return self.floor_load_kg_m2 is not None and self.floor_load_kg_m2 > self.floor_rating_kg_m2


def rack_weight(
    servers: int,
    server_weight_kg: float | None,
    server_name: str,
    tare_kg: float = RACK_TARE_KG,
    footprint_m2: float = 0.6 * RACK_DEPTH_M,
) -> tuple[float | None, float | None, str]:
    """(rack kg, floor kg/m^2, note) for a rack of ``servers``; None when a weight is unknown."""
    if server_weight_kg is None:
        return (
            None,
            None,
            f"rack weight and floor loading not known: {server_name} has no catalog weight "
            "(weight_kg); take it from the vendor's datasheet",
        )
    kg = servers * server_weight_kg + tare_kg
    return (
        kg,
        kg / footprint_m2,
        f"rack weight {kg:,.1f} kg = {servers} x {server_weight_kg:g} kg ({server_name}) + "
        f"{tare_kg:g} kg enclosure; PDUs, the out-of-band switch and cabling not counted",
    )


def plan_facility(
    *,
    servers: int,
    server_kw: float,
    server_ru: int,
    server_name: str,
    rack_limit_kw: float | None,
    cooling: str,
    pue: float | None,
    usable_ru: int,
    voltage_v: float,
    current_a: float,
    phases: int,
    redundancy: str,
    racks_available: int | None,
    network_kw: float,
    average_load: float,
    rack_units: int | None = None,
    server_weight_kg: float | None = None,
    rack_tare_kg: float = RACK_TARE_KG,
    rack_width_m: float = 0.6,
    rack_depth_m: float = RACK_DEPTH_M,
    floor_rating_kg_m2: float = FLOOR_RATING_KG_M2,
) -> Facility:
    """Lay ``servers`` into racks under the rack power limit; raise when no rack can hold one."""
    limit = rack_limit_kw if rack_limit_kw is not None else DEFAULT_RACK_KW[cooling]
    if limit < server_kw:
        raise ImpossibleConstraint(
            f"rack limit {limit:g} kW is below one {server_name} at {server_kw:g} kW",
            hint="raise constraints.rack_power (liquid cooling allows well above 40 kW per rack) "
            "or choose a candidate with a smaller server",
        )
    if usable_ru < server_ru:
        raise ImpossibleConstraint(
            f"{usable_ru} usable rack units cannot hold one {server_name} ({server_ru}U)",
            hint="raise constraints.rack_units or lower constraints.reserved_rack_units",
        )
    by_power = math.floor(limit / server_kw + 1e-9)
    by_space = usable_ru // server_ru
    per_rack = min(by_power, by_space)
    racks = math.ceil(servers / per_rack) if servers else 0
    if racks_available is not None and racks > racks_available:
        raise ImpossibleConstraint(
            f"{servers} x {server_name} need {racks} racks at {per_rack} per rack; "
            f"only {racks_available} are available",
            hint="raise constraints.rack_power (more servers per rack), add racks, "
            "or plan fewer GPUs",
        )
    rack_load = min(servers, per_rack) * server_kw
    ckw = circuit_kw(voltage_v, current_a, phases)
    cpr = circuits_per_rack(rack_load, ckw, redundancy)
    p = pue if pue is not None else DEFAULT_PUE[cooling]
    servers_kw = servers * server_kw
    it = servers_kw + network_kw
    footprint = rack_width_m * rack_depth_m
    kg, load, note = rack_weight(
        min(servers, per_rack), server_weight_kg, server_name, rack_tare_kg, footprint
    )
    return Facility(
        rack_limit_kw=limit,
        servers_per_rack=per_rack,
        servers_per_rack_limited_by="power" if by_power <= by_space else "space",
        racks=racks,
        rack_load_kw=rack_load,
        circuit_kw=ckw,
        circuits_per_rack=cpr,
        pdus=cpr * racks,
        redundancy=redundancy,
        cooling=cooling,
        pue=p,
        server_kw=server_kw,
        servers_it_kw=servers_kw,
        network_it_kw=network_kw,
        it_kw=it,
        facility_kw=it * p,
        heat_load_kw=it,
        heat_load_tons=it / KW_PER_TON,
        cooling_overhead_kw=it * (p - 1),
        average_load=average_load,
        annual_mwh=it * p * HOURS_PER_YEAR * average_load / 1000,
        server_ru=server_ru,
        usable_ru=usable_ru,
        rack_units=rack_units if rack_units is not None else usable_ru + 4,
        server_weight_kg=server_weight_kg,
        rack_tare_kg=rack_tare_kg,
        rack_weight_kg=kg,
        rack_footprint_m2=footprint,
        floor_load_kg_m2=load,
        floor_rating_kg_m2=floor_rating_kg_m2,
        weight_note=note,
    )
