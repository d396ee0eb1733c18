"""Cost: capex, yearly opex, TCO over the horizon, cost per GPU-hour, break-even against cloud.

Energy cost = facility kW (IT x PUE) x 8,760 h x average load x $/kWh. Staff = FTE x cost per FTE
a year. Hardware over the horizon H: straight-line depreciation over R years (the refresh period,
default H) to a residual value r % of capex, so depreciation a year = capex x (1 - r/100) / R
(straight-line method, IAS 16 paragraphs 50-62); the fleet is bought ceil(H / R) times and what is
left at the end is worth its book value capex - depreciation x (age at H), which is credited:
hardware cost = purchases x capex - book value at H. TCO = hardware cost + opex x H. Cost per
GPU-hour divides the TCO by GPU-hours used (GPUs x hours x utilization). Renting the same used
GPU-hours in a cloud costs GPUs x 730 h x utilization x cloud price a month; owning beats it at
the first month m with capex + m x opex/12 <= m x cloud monthly cost. A capex above the budget
is a warning (``gpufleet plan`` exits 1), not a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Cost", "cost_per_million_tokens", "hardware_over_horizon", "plan_cost"]

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12


@dataclass(frozen=True)
class Cost:
    """Money, in USD; ``None`` where the spec gave no price for that part."""

    servers_capex: float | None
    network_capex: float | None
    capex: float | None
    energy_per_year: float | None
    support_per_year: float
    space_per_year: float
    staff_per_year: float
    storage_capex: float | None
    opex_per_year: float
    horizon_years: float
    depreciation_years: float
    depreciation_per_year: float | None
    purchases: int
    residual_value: float | None
    hardware_over_horizon: float | None
    tco: float | None
    utilization: float
    cost_per_gpu_hour: float | None
    cloud_per_gpu_hour: float | None
    cloud_per_month: float | None
    cloud_over_horizon: float | None
    breakeven_month: int | None
    within_budget: bool | None
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


def hardware_over_horizon(
    capex: float, horizon_years: float, depreciation_years: float, residual_percent: float
) -> tuple[int, float, float, float]:
    """(purchases, depreciation a year, book value at the horizon, hardware cost over it).

    Straight-line: the value falls by capex x (1 - r) / R a year down to r x capex at R years; the
    fleet is replaced every R years; the last purchase's book value at H is credited back.
    """
    purchases = max(1, math.ceil(horizon_years / depreciation_years - 1e-9))
    per_year = capex * (1 - residual_percent / 100) / depreciation_years
    age = horizon_years - (purchases - 1) * depreciation_years
    book = capex - per_year * age
    return purchases, per_year, book, purchases * capex - book


def cost_per_million_tokens(
    tco: float, tokens_per_s: float, horizon_years: float, utilization: float
) -> float:
    """USD per million generated tokens: TCO / (tokens/s x seconds in the horizon x utilization)."""
    tokens = tokens_per_s * HOURS_PER_YEAR * 3600 * horizon_years * utilization
    return tco / tokens * 1e6


def plan_cost(
    *,
    gpus: int,
    servers: int,
    racks: int,
    server_price: float | None,
    switches: int,
    transceivers: int,
    switch_price: float | None,
    transceiver_price: float | None,
    facility_kw: float,
    average_load: float,
    energy_price_kwh: float | None,
    support_per_year: float | None,
    support_percent: float | None,
    space_per_rack_month: float | None,
    cloud_per_gpu_hour: float | None,
    horizon_years: float,
    utilization: float,
    budget: float | None,
    staff_fte: float = 0.0,
    staff_cost_per_fte: float | None = None,
    depreciation_years: float | None = None,
    residual_percent: float = 0.0,
    storage_capex: float | None = None,
) -> Cost:
    """Pure arithmetic over counts and prices; missing prices are left out and noted."""
    notes: list[str] = []
    servers_capex = servers * server_price if server_price is not None else None
    if servers_capex is None:
        notes.append("no server or GPU price: capex, TCO and break-even are not computed")
    net = 0.0
    priced = False
    if switch_price is not None:
        net += switches * switch_price
        priced = True
    if transceiver_price is not None:
        net += transceivers * transceiver_price
        priced = True
    if not priced:
        notes.append(
            "network (switches, optics) not priced: set prices.switch and prices.transceiver"
        )
    network_capex = net if priced else None
    capex = None if servers_capex is None else servers_capex + net + (storage_capex or 0.0)
    energy = (
        facility_kw * HOURS_PER_YEAR * average_load * energy_price_kwh
        if energy_price_kwh is not None
        else None
    )
    if energy is None:
        notes.append("no energy price: energy is not in opex")
    support = support_per_year or 0.0
    if support_percent is not None and capex is not None:
        support += capex * support_percent / 100
    space = racks * space_per_rack_month * 12 if space_per_rack_month is not None else 0.0
    staff = staff_fte * (staff_cost_per_fte or 0.0)
    opex = (energy or 0.0) + support + space + staff
    dep_years = depreciation_years or horizon_years
    purchases, dep, residual, hardware = 1, None, None, None
    if capex is not None:
        purchases, dep, residual, hardware = hardware_over_horizon(
            capex, horizon_years, dep_years, residual_percent
        )
        if purchases > 1:
            notes.append(
                f"hardware refreshed every {dep_years:g} years: bought {purchases} times over "
                f"{horizon_years:g} years, {residual:,.0f} USD book value credited at the end"
            )
    tco = hardware + opex * horizon_years if hardware is not None else None
    used_hours = gpus * HOURS_PER_YEAR * horizon_years * utilization
    per_gpu_hour = tco / used_hours if tco is not None and used_hours else None
    cloud_month = (
        gpus * HOURS_PER_MONTH * utilization * cloud_per_gpu_hour
        if cloud_per_gpu_hour is not None
        else None
    )
    cloud_total = cloud_month * 12 * horizon_years if cloud_month is not None else None
    breakeven = None
    if capex is not None and cloud_month is not None:
        saving = cloud_month - opex / 12
        if saving > 0:
            breakeven = max(1, math.ceil(capex / saving - 1e-9))
        else:
            notes.append("the cloud price is below owning's running cost: owning never breaks even")
    within = capex <= budget if capex is not None and budget is not None else None
    warnings: list[str] = []
    if within is False:
        assert capex is not None and budget is not None
        warnings.append(
            f"capex {capex:,.0f} USD exceeds the budget {budget:,.0f} USD "
            f"by {capex - budget:,.0f} USD"
        )
    elif budget is not None and capex is None:
        notes.append("a budget is set but nothing is priced: the budget is not checked")
    return Cost(
        servers_capex=servers_capex,
        network_capex=network_capex,
        capex=capex,
        energy_per_year=energy,
        support_per_year=support,
        space_per_year=space,
        staff_per_year=staff,
        storage_capex=storage_capex,
        opex_per_year=opex,
        horizon_years=horizon_years,
        depreciation_years=dep_years,
        depreciation_per_year=dep,
        purchases=purchases,
        residual_value=residual,
        hardware_over_horizon=hardware,
        tco=tco,
        utilization=utilization,
        cost_per_gpu_hour=per_gpu_hour,
        cloud_per_gpu_hour=cloud_per_gpu_hour,
        cloud_per_month=cloud_month,
        cloud_over_horizon=cloud_total,
        breakeven_month=breakeven,
        within_budget=within,
        notes=tuple(notes),
        warnings=tuple(warnings),
    )
