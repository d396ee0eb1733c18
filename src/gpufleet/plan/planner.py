"""The planner: spec + catalog -> Plan, a tree of frozen dataclasses. Pure: no file or network I/O.

Flow (DESIGN.md): sizing (memory, compute) -> hardware -> facility -> fabric -> storage -> cost,
once per candidate; the cheapest feasible candidate (by TCO, else days, else power) is chosen.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from gpufleet.catalog import Catalog, load_catalog
from gpufleet.errors import ConfigError, UsageError
from gpufleet.plan.compute import (
    MFU_RANGE,
)
from gpufleet.plan.cost import Cost, cost_per_million_tokens, plan_cost
from gpufleet.plan.fabric import (
    RA_UFM_COMPUTE_LINKS,
    Fabric,
    Layout,
    compute_fabric_need,
    plan_fabric,
)
from gpufleet.plan.facility import (
    DEFAULT_PUE,
    DEFAULT_RACK_KW,
    Facility,
    ImpossibleConstraint,
    plan_facility,
)
from gpufleet.plan.hardware import PILOT_FORM_FACTORS, Server, resolve_candidate
from gpufleet.plan.memory import resolve_architecture
from gpufleet.plan.plant import Plant, plan_plant
from gpufleet.plan.site_checks import candidate_cooling, site_notes, site_warnings
from gpufleet.plan.sizing import WorkloadPlan, size_workload
from gpufleet.plan.spec import (
    GpuCountWorkload,
    HpcWorkload,
    InferenceWorkload,
    PlanSpec,
    TrainingWorkload,
)
from gpufleet.plan.storage import HpcIo, Storage, plan_storage

__all__ = ["CandidatePlan", "Plan", "WorkloadPlan", "plan"]


@dataclass(frozen=True)
class CandidatePlan:
    """Everything planned for one candidate; ``problem`` says why it is infeasible when it is."""

    candidate: str
    server: Server
    feasible: bool
    problem: str | None
    workloads: tuple[WorkloadPlan, ...]
    gpus: int
    servers: int
    facility: Facility | None
    fabric: Fabric | None
    storage: Storage | None
    cost: Cost | None
    training_days: float | None
    run_energy_mwh: float | None
    tokens_per_joule: float | None
    notes: tuple[str, ...]
    plant: Plant | None = None
    cost_per_million_tokens: float | None = None
    warnings: tuple[str, ...] = ()
    layout: Layout | None = None
    management_nodes: int = 0


@dataclass(frozen=True)
class Plan:
    """The whole plan: every candidate, the chosen one, and the assumptions made."""

    name: str
    horizon_years: float
    chosen: str | None
    candidates: tuple[CandidatePlan, ...]
    assumptions: tuple[str, ...]

    @property
    def best(self) -> CandidatePlan | None:
        return next((c for c in self.candidates if c.candidate == self.chosen), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        """The chosen candidate's warnings (``gpufleet plan`` exits 1 when there are any)."""
        best = self.best
        return best.warnings if best else ()


def _price_for(
    prices: float | dict[str, float] | None, field: str, server: Server, candidates: list[str]
) -> float | None:
    if prices is None or isinstance(prices, float | int):
        return prices
    for key in (server.candidate, server.key, server.gpu_key):
        if key in prices:
            return prices[key]
    for key in prices:
        if key not in candidates:
            close = difflib.get_close_matches(key, candidates, 1)
            raise ConfigError(
                f"prices.{field}.{key}: not one of the candidates",
                hint=f"did you mean {close[0]!r}?"
                if close
                else f"candidates: {', '.join(candidates)}",
            )
    return None


def _infeasible(
    server: Server,
    problem: str,
    sized: tuple[WorkloadPlan, ...] = (),
    gpus: int = 0,
    servers: int = 0,
    notes: tuple[str, ...] = (),
) -> CandidatePlan:
    """A candidate that cannot be built, with what was sized before the ``problem`` showed."""
    return CandidatePlan(
        server.candidate,
        server,
        False,
        problem,
        sized,
        gpus,
        servers,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        notes,
    )


def _plan_candidate(spec: PlanSpec, server: Server, catalog: Catalog) -> CandidatePlan:
    c, p = spec.constraints, spec.prices
    try:
        sized = tuple(
            size_workload(w, server, catalog, c.memory_headroom, i)
            for i, w in enumerate(spec.workloads)
        )
    except ConfigError:
        raise
    except UsageError as exc:  # e.g. no FP64 units: this candidate cannot run the workload
        return _infeasible(server, str(exc))
    gpus = sum(w.gpus for w in sized)
    servers = math.ceil(gpus / server.gpus)
    notes: list[str] = []
    for w in sized:
        for n in (
            (w.training.notes if w.training else ())
            + (w.inference.notes if w.inference else ())
            + w.notes
        ):
            notes.append(f"{w.name}: {n}")
    if c.gpus_per_server and server.gpus != c.gpus_per_server:
        notes.append(
            f"constraints.gpus_per_server {c.gpus_per_server} applies to PCIe GPUs without a "
            f"catalog system; {server.name} holds {server.gpus}"
        )
    asked = sum(w.gpus for w in spec.workloads if isinstance(w, GpuCountWorkload))
    if all(isinstance(w, GpuCountWorkload) for w in spec.workloads) and asked <= 4 < server.gpus:
        notes.append(
            f"a {asked}-GPU pilot on {server.name} buys a whole {server.gpus}-GPU server; "
            "a PCIe candidate (h100-pcie, l40s, ...) plans a 1-4 GPU server or workstation"
        )
    fits = all(
        (w.training.fits if w.training else True) and (w.inference.fits if w.inference else True)
        for w in sized
    )

    def infeasible(problem: str) -> CandidatePlan:
        return _infeasible(server, problem, sized, gpus, servers, tuple(notes))

    # Cooling follows the catalog system unless the spec says otherwise (site_checks.py).
    system = catalog.systems.get(server.key)
    cooling, cooling_warning, cooling_note = candidate_cooling(c.cooling, system)
    if cooling_note:
        notes.append(cooling_note)

    def facility(
        *,
        rack_limit_kw: float | None,
        racks_available: int | None,
        network_kw: float,
        rack_units: int | None = None,
    ) -> Facility:
        return plan_facility(
            servers=servers,
            server_kw=server.power_kw,
            server_ru=server.rack_units,
            server_name=server.name,
            rack_limit_kw=rack_limit_kw,
            cooling=cooling,
            pue=c.pue,
            usable_ru=c.rack_units - c.reserved_rack_units,
            voltage_v=c.circuit.voltage,
            current_a=c.circuit.current,
            phases=c.circuit.phases,
            redundancy=c.redundancy,
            racks_available=racks_available,
            network_kw=network_kw,
            average_load=p.utilization,
            rack_units=rack_units,
            server_weight_kg=system.weight_kg if system is not None else None,
            rack_tare_kg=c.rack_tare_kg,
            rack_width_m=c.rack_width,
            rack_depth_m=c.rack_depth,
            floor_rating_kg_m2=c.floor_rating_kg_m2,
        )

    if not fits:
        return infeasible(
            f"the model does not fit in {server.gpu_name} memory "
            f"({server.gpu_memory_bytes / 1e9:.0f} GB) with any layout"
        )
    # Head nodes / UFM appliances: management_nodes_per_su for every started scalable unit.
    mgmt = math.ceil(servers / c.scalable_unit) * c.management_nodes_per_su
    # A compute (east-west) fabric only where a workload's parallelism spans nodes (fabric.py).
    coupled = [getattr(w, "coupled", True) for w in spec.workloads]
    east_west, east_west_why = compute_fabric_need(sized, server.gpus, servers, coupled)
    links = c.management_compute_links
    mgmt_links = RA_UFM_COMPUTE_LINKS if links == "auto" else links
    # Servers per rack first (network power depends on the switch count, which depends on racks).
    try:
        fac0 = facility(
            rack_limit_kw=c.rack_power / 1000 if c.rack_power else None,
            racks_available=c.racks_available,
            network_kw=0.0,
        )
        layout = Layout(
            fac0.racks, fac0.servers_per_rack, c.racks_per_row, c.rack_width, c.row_pitch
        )
        fabric = plan_fabric(
            servers=servers,
            compute_nics=server.compute_nics if east_west else 0,
            storage_nics=server.storage_nics,
            radix=c.switch_radix,
            port_gbps=c.switch_port_gbps,
            layout=layout,
            pdus=fac0.pdus,
            management_nodes=mgmt,
            management_compute_links=mgmt_links,
            compute_reason=east_west_why,
        )
    except UsageError as exc:
        return infeasible(str(exc))
    if fabric.management_grew:
        notes.append(fabric.management_reason)
    fac = facility(
        rack_limit_kw=fac0.rack_limit_kw,
        racks_available=None,
        network_kw=(fabric.data_switches * c.switch_power + mgmt * c.management_node_power) / 1000,
        rack_units=c.rack_units,
    )
    trainings = [w.training for w in sized if w.training]
    train_params = max(
        (w.architecture.parameters for w in sized if w.training and w.architecture), default=0.0
    )
    training_nodes = max((math.ceil(w.gpus / server.gpus) for w in sized if w.training), default=0)
    hpc_io = [
        HpcIo(
            w.name,
            math.ceil(w.gpus / server.gpus),
            ws.dataset if ws.dataset is not None else w.hpc.working_set_bytes,
            ws.read_time,
            ws.dataset_per_node,
        )
        for ws, w in zip(spec.workloads, sized, strict=True)
        if isinstance(ws, HpcWorkload) and w.hpc
    ]
    storage = plan_storage(
        parameters=train_params,
        tokens_per_s=sum(t.tokens_per_s for t in trainings),
        checkpoint_time_s=spec.storage.checkpoint_time,
        dataset_bytes_per_token=spec.storage.dataset_bytes_per_token,
        nodes=servers,
        local_nvme_bytes=server.local_nvme_bytes,
        training_nodes=training_nodes,
        tokens=sum(
            w_spec.tokens for w_spec in spec.workloads if isinstance(w_spec, TrainingWorkload)
        ),
        checkpoints_kept=spec.storage.checkpoints_kept,
        dataset_bytes=spec.storage.dataset,
        hpc=hpc_io,
    )
    storage_capex = (
        storage.capacity_bytes / 1e12 * p.pfs_per_tb
        if storage.parallel_fs_recommended and p.pfs_per_tb is not None
        else None
    )
    if storage.parallel_fs_recommended and p.pfs_per_tb is None:
        notes.append("parallel file system not priced: set prices.pfs_per_tb")
    plant = plan_plant(
        it_kw=fac.it_kw,
        facility_kw=fac.facility_kw,
        redundancy=c.redundancy,
        cooling=cooling,
        runtime_s=c.ups_runtime,
        battery=c.ups_battery,
        generator_unit_kw=c.generator_size / 1000 if c.generator_size is not None else None,
        loading=c.generator_loading,
        liquid_fraction=c.liquid_fraction,
        cdu_capacity_kw=c.cdu_capacity / 1000,
        coolant_delta_t=c.coolant_delta_t,
        air_delta_t=c.air_delta_t,
    )
    server_price = _price_for(p.server, "server", server, spec.candidates)
    if server_price is None:
        gpu_price = _price_for(p.gpu, "gpu", server, spec.candidates)
        server_price = gpu_price * server.gpus if gpu_price is not None else None
    cost = plan_cost(
        gpus=gpus,
        servers=servers,
        racks=fac.racks,
        server_price=server_price,
        switches=fabric.data_switches,
        transceivers=fabric.transceivers,
        switch_price=p.switch,
        transceiver_price=p.transceiver,
        facility_kw=fac.facility_kw,
        average_load=p.utilization,
        energy_price_kwh=p.energy,
        support_per_year=p.support_per_year,
        support_percent=p.support_percent_of_capex,
        space_per_rack_month=p.space_per_rack_month,
        cloud_per_gpu_hour=p.cloud_per_gpu_hour,
        horizon_years=spec.horizon_years,
        utilization=p.utilization,
        budget=c.budget,
        staff_fte=p.staff_fte,
        staff_cost_per_fte=p.staff_cost_per_fte,
        depreciation_years=p.depreciation_years,
        residual_percent=p.residual_percent,
        storage_capex=storage_capex,
    )
    days = max((t.days for t in trainings), default=None)
    run_mwh = fac.facility_kw * days * 24 / 1000 if days is not None else None
    tokens = sum(t.tokens_per_s * t.days * 86400 for t in trainings)
    served = sum(w.inference.decode_tokens_per_s for w in sized if w.inference)
    if run_mwh:
        tpj: float | None = tokens / (run_mwh * 3.6e9)
    else:
        tpj = served / (fac.facility_kw * 1000) if served else None
    cpm = None
    if served and cost.tco is not None:
        share = sum(w.gpus for w in sized if w.inference) / gpus
        cpm = cost_per_million_tokens(cost.tco * share, served, spec.horizon_years, p.utilization)
    if server.generic:
        notes.append(f"{server.name}: {server.source}")
    notes.extend(site_notes(fac, plant))
    site_warned = ((cooling_warning,) if cooling_warning else ()) + site_warnings(fac)
    return CandidatePlan(
        server.candidate,
        server,
        True,
        None,
        sized,
        gpus,
        servers,
        fac,
        fabric,
        storage,
        cost,
        days,
        run_mwh,
        tpj,
        tuple(notes + list(cost.notes)),
        plant,
        cpm,
        cost.warnings + site_warned,
        layout,
        mgmt,
    )


def _assumptions(spec: PlanSpec, cands: list[CandidatePlan]) -> tuple[str, ...]:
    c = spec.constraints
    out = [
        "training FLOPs = 6 x parameters x tokens (Kaplan et al. 2020; Hoffmann et al. 2022)",
        f"MFU range shown {MFU_RANGE[0]:.2f}-{MFU_RANGE[1]:.2f} around each workload's MFU",
        f"GPU memory usable: {1 - c.memory_headroom:.0%} (CUDA context, fragmentation)",
        "server power is the catalog system's maximum (never GPU TDP alone)",
        f"average load {spec.prices.utilization:.0%} of maximum power for energy",
        f"switch power {c.switch_power / 1000:g} kW each with optics (constraints.switch_power)",
    ]
    coolings = sorted({cp.facility.cooling for cp in cands if cp.facility} or {c.cooling or "air"})
    if c.cooling is None:
        out.append("cooling follows each candidate system's catalog cooling type (generic: air)")
    for cool in coolings:
        if c.pue is None:
            out.append(f"PUE {DEFAULT_PUE[cool]} (default for {cool} cooling)")
        if c.rack_power is None:
            out.append(
                f"rack power limit {DEFAULT_RACK_KW[cool]:g} kW (default for {cool} cooling)"
            )
    for w in spec.workloads:
        if isinstance(w, TrainingWorkload | InferenceWorkload) and w.model.layers is None:
            a = resolve_architecture(w.model)
            out.append(
                f"{w.name}: architecture derived from {a.parameters:.3g} parameters "
                f"(12 L h^2, h/L = 128): {a.layers} layers, hidden {a.hidden_size}, "
                f"{a.heads} heads"
            )
    for cp in cands:
        if cp.server.generic:
            out.append(f"{cp.candidate}: no catalog system; {cp.server.source}")
    return tuple(out)


def _server(spec: PlanSpec, catalog: Catalog, name: str, index: int) -> Server:
    """The candidate's server; a PCIe GPU without a catalog system becomes a 1, 2 or 4-GPU pilot
    server when the workloads need at most 4 GPUs (or the spec sets gpus_per_server)."""
    c = spec.constraints
    field = f"candidates[{index}]"
    server = resolve_candidate(
        catalog, name, c.generic_host_overhead, field, c.gpus_per_server, c.pilot_host_overhead
    )
    gpu = catalog.gpus[server.gpu_key]
    if not server.generic or c.gpus_per_server or gpu.form_factor not in PILOT_FORM_FACTORS:
        return server
    one = resolve_candidate(catalog, name, c.generic_host_overhead, field, 1, 0.0)
    try:
        need = sum(
            size_workload(w, one, catalog, c.memory_headroom, i).gpus
            for i, w in enumerate(spec.workloads)
        )
    except UsageError:
        return server
    if need > 4:
        return server
    size = 1 << max(0, need - 1).bit_length()  # 1, 2 or 4
    return resolve_candidate(
        catalog, name, c.generic_host_overhead, field, size, c.pilot_host_overhead
    )


def plan(spec: PlanSpec, catalog: Catalog | None = None) -> Plan:
    """Plan every candidate; raise when none is feasible, explaining each candidate's problem."""
    catalog = catalog or load_catalog()
    servers = [_server(spec, catalog, name, i) for i, name in enumerate(spec.candidates)]
    cands = [_plan_candidate(spec, s, catalog) for s in servers]
    feasible = [c for c in cands if c.feasible]
    if len(cands) == 1 and not feasible:
        raise ImpossibleConstraint(cands[0].problem or "infeasible")
    if not feasible:
        problems = "; ".join(f"{c.candidate}: {c.problem}" for c in cands)
        raise ImpossibleConstraint(f"no candidate is feasible: {problems}")

    def rank(cp: CandidatePlan) -> tuple[bool, float, float, float]:
        tco = cp.cost.tco if cp.cost and cp.cost.tco is not None else math.inf
        days = cp.training_days if cp.training_days is not None else math.inf
        kw = cp.facility.facility_kw if cp.facility else math.inf
        over = bool(cp.cost and cp.cost.within_budget is False)
        return (over, tco, days, kw)

    chosen = min(feasible, key=rank).candidate
    return Plan(spec.name, spec.horizon_years, chosen, tuple(cands), _assumptions(spec, cands))
