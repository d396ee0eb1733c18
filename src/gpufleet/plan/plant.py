"""Site plant: UPS (kVA, runtime, battery energy), standby generators, liquid and air cooling.

Sources and rules:
- kVA = kW / power factor. UPS output rated at power factor 0.9 (Schneider Electric White Paper 15,
  "Watts and Volt-Amps: Powerful Confusion": modern IT UPSs are rated 0.9-1.0); the UPS carries
  the IT load (servers, switches). 2N: two full systems; N+1: one spare module of the module size
  (a quarter of the load here, four active modules); N: none.
- Battery energy at the DC bus = IT kW x runtime / inverter efficiency 0.95 (double-conversion UPS
  efficiency at load, IEC 62040-3 class VFI). Nameplate kWh comes from the vendor's discharge
  tables for the battery type (short runtimes derate lead-acid more than lithium-ion).
- Generators carry the whole facility (IT x PUE: cooling must run too). Gensets are rated in kVA
  at power factor 0.8 (ISO 8528-1), so kVA = facility kW / 0.8. Each set runs at most
  ``generator_loading`` (default 0.8) of its standby kW rating: a generator runs best at about 80 %
  of capacity and accepts only part of its rating as one block load (Power Continuity, "Do I need
  a larger generator than my peak demand?", powercontinuity.co.uk: acceptance typically 55-65 %;
  ISO 8528-5 load-acceptance classes). The UPS rides through the transfer and its rectifiers walk
  the IT load onto the set, so the remaining 20 % is headroom for the cooling plant's motor steps.
  The unit is ``constraints.generator_size`` when set, else the smallest standard standby rating
  (``STANDARD_GENSET_KW``) that carries the load, in parallel sets of the largest rating above it;
  plus one (N+1) or doubled (2N). Under ``ONSITE_GENERATOR_MIN_KW`` of facility load the plan says
  that such a site normally relies on the building's or colocation provider's generators.
- Liquid cooling: heat to liquid = IT kW x ``liquid_fraction`` (direct-to-chip cold plates take
  the GPUs' and CPUs' heat; the rest stays in air). Coolant flow from Q = m x cp x dT: L/min per
  kW = 60 / (cp 4.186 kJ/(kg K) x 1 kg/L x dT), water; 1.43 L/min per kW at dT 10 K. CDUs of
  ``cdu_capacity`` kW each, N+1.
- Air: airflow m3/h = kW x 3600 / (1.2 kg/m3 x 1.006 kJ/(kg K) x dT) (ASHRAE Handbook,
  Fundamentals: air at 20 C); CFM = m3/h / 1.699.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "GENERATOR_LOADING",
    "ONSITE_GENERATOR_MIN_KW",
    "STANDARD_GENSET_KW",
    "Plant",
    "coolant_litres_per_min_per_kw",
    "plan_plant",
    "size_generators",
]

UPS_POWER_FACTOR = 0.9
UPS_EFFICIENCY = 0.95
GENERATOR_POWER_FACTOR = 0.8
WATER_CP_KJ_PER_KG_K = 4.186
AIR_DENSITY_KG_M3 = 1.2
AIR_CP_KJ_PER_KG_K = 1.006
M3H_PER_CFM = 1.699
GENERATOR_LOADING = 0.8
# Standby (ESP) kW ratings at 60 Hz, 0.8 pf, of the diesel sets vendors sell: Cummins Power
# Generation names its sets by standby kW (spec sheets: C25-C40 D6 "25 kW - 40 kW", C80/C100/
# C150/C200/C350 D6 commercial series, DFEK "500 kW, 625 kVA standby", QSK60/QSK95 sets up to
# C3000 D6); Caterpillar's range runs from 20 ekW to the C175-20 at 3,000 ekW.
STANDARD_GENSET_KW: tuple[float, ...] = (
    20, 30, 40, 50, 60, 80, 100, 125, 150, 175, 200, 250, 300, 350, 400, 450, 500,
    600, 750, 800, 1000, 1250, 1500, 1750, 2000, 2250, 2500, 2750, 3000,
)  # fmt: skip
# Below this facility load a site is retail-colocation or office scale: colocation customers
# "usually need less than 100 kilowatts" (DCSMI, "Comparing wholesale data centers vs. colocation
# data centers"); wholesale suites with their own plant start at 100-250 kW (1547 Realty,
# "Colocation showdown: wholesale vs. retail"). Such a site runs on the building's or provider's
# standby generators, not its own.
ONSITE_GENERATOR_MIN_KW = 100.0


def coolant_litres_per_min_per_kw(delta_t_k: float) -> float:
    """Water flow per kW of heat at a supply/return difference of ``delta_t_k``."""
    return 60.0 / (WATER_CP_KJ_PER_KG_K * 1.0 * delta_t_k)


def size_generators(
    facility_kw: float,
    redundancy: str,
    unit_kw: float | None = None,
    loading: float = GENERATOR_LOADING,
) -> tuple[float, int, str]:
    """(unit kW, sets, basis) carrying ``facility_kw`` at ``loading`` of each set's rating.

    ``unit_kw`` (the user's ``generator_size``) wins; else the smallest standard rating that carries
    the load alone, or, above the largest, the smallest rating that n parallel sets of at most the
    largest rating share. N+1 adds one set, 2N doubles them."""
    need = facility_kw / loading
    if unit_kw is not None:
        basis = "constraints.generator_size"
    else:
        largest = STANDARD_GENSET_KW[-1]
        per_set = need / max(1, math.ceil(need / largest - 1e-9))
        unit_kw = next(r for r in STANDARD_GENSET_KW if r >= per_set - 1e-9)
        basis = "smallest standard standby rating"
    n = max(1, math.ceil(need / unit_kw - 1e-9)) if facility_kw else 0
    n = {"N": n, "N+1": n + 1, "2N": 2 * n}[redundancy] if n else 0
    return float(unit_kw), n, basis


@dataclass(frozen=True)
class Plant:
    """UPS, generators and cooling plant for one candidate's facility."""

    ups_load_kw: float
    ups_kva: float
    ups_systems: int
    ups_installed_kva: float
    ups_runtime_s: float
    ups_battery: str
    battery_kwh: float
    generator_kva: float
    generator_unit_kw: float
    generators: int
    liquid_kw: float
    cdus: int
    cdu_capacity_kw: float
    coolant_l_per_min: float
    coolant_l_per_min_per_kw: float
    air_kw: float
    airflow_m3_per_h: float
    airflow_cfm: float
    generator_loading: float = GENERATOR_LOADING
    generator_required_kw: float = 0.0
    generator_unit_basis: str = ""
    generator_note: str | None = None


def plan_plant(
    *,
    it_kw: float,
    facility_kw: float,
    redundancy: str,
    cooling: str,
    runtime_s: float,
    battery: str,
    generator_unit_kw: float | None,
    liquid_fraction: float,
    cdu_capacity_kw: float,
    coolant_delta_t: float,
    air_delta_t: float,
    loading: float = GENERATOR_LOADING,
) -> Plant:
    """The plant for ``it_kw`` of IT load (``facility_kw`` with cooling) under ``redundancy``.

    ``generator_unit_kw`` None sizes the gensets from the load (standard ratings)."""
    kva = it_kw / UPS_POWER_FACTOR
    if redundancy == "2N":
        systems, installed = 2, 2 * kva
    elif redundancy == "N+1":
        systems, installed = 1, kva * 5 / 4  # four active modules + one spare
    else:
        systems, installed = 1, kva
    unit_kw, n_gen, basis = size_generators(facility_kw, redundancy, generator_unit_kw, loading)
    note = None
    if 0 < facility_kw < ONSITE_GENERATOR_MIN_KW:
        note = (
            f"a {facility_kw:,.1f} kW site is under {ONSITE_GENERATOR_MIN_KW:,.0f} kW: in an "
            "office building or a colocation cage it normally runs on the building's or the "
            "provider's "
            f"standby generators; the {n_gen} x {unit_kw:,.0f} kW gensets are for a standalone site"
        )
    liquid = it_kw * liquid_fraction if cooling == "liquid" else 0.0
    per_kw = coolant_litres_per_min_per_kw(coolant_delta_t)
    cdus = math.ceil(liquid / cdu_capacity_kw - 1e-9) + 1 if liquid else 0
    air = it_kw - liquid
    m3h = air * 3600 / (AIR_DENSITY_KG_M3 * AIR_CP_KJ_PER_KG_K * air_delta_t)
    return Plant(
        ups_load_kw=it_kw,
        ups_kva=kva,
        ups_systems=systems,
        ups_installed_kva=installed,
        ups_runtime_s=runtime_s,
        ups_battery=battery,
        battery_kwh=it_kw * runtime_s / 3600 / UPS_EFFICIENCY,
        generator_kva=facility_kw / GENERATOR_POWER_FACTOR,
        generator_unit_kw=unit_kw,
        generators=n_gen,
        liquid_kw=liquid,
        cdus=cdus,
        cdu_capacity_kw=cdu_capacity_kw,
        coolant_l_per_min=liquid * per_kw,
        coolant_l_per_min_per_kw=per_kw,
        air_kw=air,
        airflow_m3_per_h=m3h,
        airflow_cfm=m3h / M3H_PER_CFM,
        generator_loading=loading,
        generator_required_kw=facility_kw / loading,
        generator_unit_basis=basis,
        generator_note=note,
    )
