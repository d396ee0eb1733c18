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
  at power factor 0.8 (ISO 8528-1), so kVA = facility kW / 0.8; units of ``generator_size`` kW,
  plus one (N+1) or doubled (2N).
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

__all__ = ["Plant", "coolant_litres_per_min_per_kw", "plan_plant"]

UPS_POWER_FACTOR = 0.9
UPS_EFFICIENCY = 0.95
GENERATOR_POWER_FACTOR = 0.8
WATER_CP_KJ_PER_KG_K = 4.186
AIR_DENSITY_KG_M3 = 1.2
AIR_CP_KJ_PER_KG_K = 1.006
M3H_PER_CFM = 1.699


def coolant_litres_per_min_per_kw(delta_t_k: float) -> float:
    """Water flow per kW of heat at a supply/return difference of ``delta_t_k``."""
    return 60.0 / (WATER_CP_KJ_PER_KG_K * 1.0 * delta_t_k)


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


def plan_plant(
    *,
    it_kw: float,
    facility_kw: float,
    redundancy: str,
    cooling: str,
    runtime_s: float,
    battery: str,
    generator_unit_kw: float,
    liquid_fraction: float,
    cdu_capacity_kw: float,
    coolant_delta_t: float,
    air_delta_t: float,
) -> Plant:
    """The plant for ``it_kw`` of IT load (``facility_kw`` with cooling) under ``redundancy``."""
    kva = it_kw / UPS_POWER_FACTOR
    if redundancy == "2N":
        systems, installed = 2, 2 * kva
    elif redundancy == "N+1":
        systems, installed = 1, kva * 5 / 4  # four active modules + one spare
    else:
        systems, installed = 1, kva
    gen_kva = facility_kw / GENERATOR_POWER_FACTOR
    unit_kva = generator_unit_kw / GENERATOR_POWER_FACTOR
    n_gen = max(1, math.ceil(gen_kva / unit_kva - 1e-9)) if facility_kw else 0
    n_gen = {"N": n_gen, "N+1": n_gen + 1, "2N": 2 * n_gen}[redundancy] if n_gen else 0
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
        generator_kva=gen_kva,
        generator_unit_kw=generator_unit_kw,
        generators=n_gen,
        liquid_kw=liquid,
        cdus=cdus,
        cdu_capacity_kw=cdu_capacity_kw,
        coolant_l_per_min=liquid * per_kw,
        coolant_l_per_min_per_kw=per_kw,
        air_kw=air,
        airflow_m3_per_h=m3h,
        airflow_cfm=m3h / M3H_PER_CFM,
    )
