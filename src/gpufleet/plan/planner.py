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
    InferenceSizing,
    TrainingSizing,
    size_inference,
    size_training,
)
from gpufleet.plan.cost import Cost, plan_cost
from gpufleet.plan.fabric import Fabric, Layout, plan_fabric
from gpufleet.plan.facility import (
    DEFAULT_PUE,
    DEFAULT_RACK_KW,
    Facility,
    ImpossibleConstraint,
    plan_facility,
)
from gpufleet.plan.hardware import Server, resolve_candidate
from gpufleet.plan.memory import Architecture, resolve_architecture
from gpufleet.plan.spec import (
    BYTES_PER_VALUE,
    GpuCountWorkload,
    InferenceWorkload,
    PlanSpec,
    TrainingWorkload,
)
from gpufleet.plan.storage import Storage, plan_storage

__all__ = ["CandidatePlan", "Plan", "WorkloadPlan", "plan"]

# Precision used for the compute peak when weights are stored as integers.
_COMPUTE_PRECISION = {"int8": "fp8", "int4": "fp4", "fp32": "tf32"}


@dataclass(frozen=True)
class WorkloadPlan:
    """One workload sized on one candidate."""

    name: str
    kind: str
    gpus: int
    architecture: Architecture | None
    training: TrainingSizing | None
    inference: InferenceSizing | None


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


def _size(
    w: TrainingWorkload | InferenceWorkload | GpuCountWorkload,
    server: Server,
    catalog: Catalog,
    headroom: float,
) -> WorkloadPlan:
    gpu = catalog.gpus[server.gpu_key]
    cap = server.gpu_memory_bytes * (1 - headroom)
    if isinstance(w, GpuCountWorkload):
        n = -(-w.gpus // server.gpus) * server.gpus
        return WorkloadPlan(w.name, w.kind, n, None, None, None)
    arch = resolve_architecture(w.model)
    if isinstance(w, TrainingWorkload):
        peak = gpu.tflops.get(w.precision)
        if not peak:
            raise UsageError(
                f"{gpu.marketing_name} has no {w.precision} tensor-core peak in the catalog",
                hint="choose another precision or candidate",
            )
        tr = size_training(
            arch,
            tokens=w.tokens,
            seq=w.sequence_length,
            global_batch=w.global_batch,
            micro_batch=w.micro_batch,
            zero_stage=w.zero_stage,
            tp=None if w.tensor_parallel == "auto" else w.tensor_parallel,
            pp=None if w.pipeline_parallel == "auto" else w.pipeline_parallel,
            dp=None if w.data_parallel == "auto" else w.data_parallel,
            sequence_parallel=w.sequence_parallel,
            recompute=w.recompute,
            capacity_bytes=cap,
            peak_tflops=peak,
            mfu=w.mfu,
            target_days=w.target_days,
            gpus=w.gpus,
            gpus_per_server=server.gpus,
        )
        return WorkloadPlan(w.name, w.kind, tr.gpus, arch, tr, None)
    prec = _COMPUTE_PRECISION.get(w.weights_precision, w.weights_precision)
    peak = gpu.tflops.get(prec) or gpu.tflops.get("fp16") or gpu.tflops.get("bf16")
    if not peak:
        raise UsageError(f"{gpu.marketing_name} has no tensor-core peak for {prec} in the catalog")
    inf = size_inference(
        arch,
        weight_bytes_per_value=BYTES_PER_VALUE[w.weights_precision],
        kv_bytes_per_value=BYTES_PER_VALUE[w.kv_cache_precision],
        context=w.context_length,
        concurrent=w.concurrent_sequences,
        target_tokens_per_s=w.target_tokens_per_s,
        capacity_bytes=cap,
        bandwidth_gbps=server.gpu_bandwidth_gbps,
        bandwidth_efficiency=w.bandwidth_efficiency,
        peak_tflops=peak,
        mfu=w.mfu,
        gpus_per_server=server.gpus,
        tp=None if w.tensor_parallel == "auto" else w.tensor_parallel,
    )
    return WorkloadPlan(w.name, w.kind, inf.gpus, arch, None, inf)


def _plan_candidate(spec: PlanSpec, server: Server, catalog: Catalog) -> CandidatePlan:
    c, p = spec.constraints, spec.prices
    sized = tuple(_size(w, server, catalog, c.memory_headroom) for w in spec.workloads)
    gpus = sum(w.gpus for w in sized)
    servers = math.ceil(gpus / server.gpus)
    notes: list[str] = []
    for w in sized:
        for n in (w.training.notes if w.training else ()) + (
            w.inference.notes if w.inference else ()
        ):
            notes.append(f"{w.name}: {n}")
    fits = all(
        (w.training.fits if w.training else True) and (w.inference.fits if w.inference else True)
        for w in sized
    )

    def infeasible(problem: str) -> CandidatePlan:
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
            tuple(notes),
        )

    if not fits:
        return infeasible(
            f"the model does not fit in {server.gpu_name} memory "
            f"({server.gpu_memory_bytes / 1e9:.0f} GB) with any layout"
        )
    # Servers per rack first (network power depends on the switch count, which depends on racks).
    try:
        fac0 = plan_facility(
            servers=servers,
            server_kw=server.power_kw,
            server_ru=server.rack_units,
            server_name=server.name,
            rack_limit_kw=c.rack_power / 1000 if c.rack_power else None,
            cooling=c.cooling,
            pue=c.pue,
            usable_ru=c.rack_units - c.reserved_rack_units,
            voltage_v=c.circuit.voltage,
            current_a=c.circuit.current,
            phases=c.circuit.phases,
            redundancy=c.redundancy,
            racks_available=c.racks_available,
            network_kw=0.0,
            average_load=p.utilization,
        )
        layout = Layout(
            fac0.racks, fac0.servers_per_rack, c.racks_per_row, c.rack_width, c.row_pitch
        )
        fabric = plan_fabric(
            servers=servers,
            compute_nics=server.compute_nics,
            storage_nics=server.storage_nics,
            radix=c.switch_radix,
            port_gbps=c.switch_port_gbps,
            layout=layout,
            pdus=fac0.pdus,
        )
    except UsageError as exc:
        return infeasible(str(exc))
    fac = plan_facility(
        servers=servers,
        server_kw=server.power_kw,
        server_ru=server.rack_units,
        server_name=server.name,
        rack_limit_kw=fac0.rack_limit_kw,
        cooling=c.cooling,
        pue=c.pue,
        usable_ru=c.rack_units - c.reserved_rack_units,
        voltage_v=c.circuit.voltage,
        current_a=c.circuit.current,
        phases=c.circuit.phases,
        redundancy=c.redundancy,
        racks_available=None,
        network_kw=fabric.data_switches * c.switch_power / 1000,
        average_load=p.utilization,
    )
    trainings = [w.training for w in sized if w.training]
    train_params = max(
        (w.architecture.parameters for w in sized if w.training and w.architecture), default=0.0
    )
    storage = plan_storage(
        parameters=train_params,
        tokens_per_s=sum(t.tokens_per_s for t in trainings),
        checkpoint_time_s=spec.storage.checkpoint_time,
        dataset_bytes_per_token=spec.storage.dataset_bytes_per_token,
        nodes=servers,
        local_nvme_bytes=server.local_nvme_bytes,
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
    )
    days = max((t.days for t in trainings), default=None)
    run_mwh = fac.facility_kw * days * 24 / 1000 if days is not None else None
    tokens = sum(t.tokens_per_s * t.days * 86400 for t in trainings)
    if run_mwh:
        tpj: float | None = tokens / (run_mwh * 3.6e9)
    else:
        served = sum(w.inference.decode_tokens_per_s for w in sized if w.inference)
        tpj = served / (fac.facility_kw * 1000) if served else None
    if server.generic:
        notes.append(f"{server.name}: {server.source}")
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
    if c.pue is None:
        out.append(f"PUE {DEFAULT_PUE[c.cooling]} (default for {c.cooling} cooling)")
    if c.rack_power is None:
        out.append(
            f"rack power limit {DEFAULT_RACK_KW[c.cooling]:g} kW (default for {c.cooling} cooling)"
        )
    for w in spec.workloads:
        if not isinstance(w, GpuCountWorkload) and w.model.layers is None:
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


def plan(spec: PlanSpec, catalog: Catalog | None = None) -> Plan:
    """Plan every candidate; raise when none is feasible, explaining each candidate's problem."""
    catalog = catalog or load_catalog()
    servers = [
        resolve_candidate(catalog, name, spec.constraints.generic_host_overhead, f"candidates[{i}]")
        for i, name in enumerate(spec.candidates)
    ]
    cands = [_plan_candidate(spec, s, catalog) for s in servers]
    feasible = [c for c in cands if c.feasible]
    if len(cands) == 1 and not feasible:
        raise ImpossibleConstraint(cands[0].problem or "infeasible")
    if not feasible:
        problems = "; ".join(f"{c.candidate}: {c.problem}" for c in cands)
        raise ImpossibleConstraint(f"no candidate is feasible: {problems}")

    def rank(cp: CandidatePlan) -> tuple[float, float, float]:
        tco = cp.cost.tco if cp.cost and cp.cost.tco is not None else math.inf
        days = cp.training_days if cp.training_days is not None else math.inf
        kw = cp.facility.facility_kw if cp.facility else math.inf
        return (tco, days, kw)

    chosen = min(feasible, key=rank).candidate
    return Plan(spec.name, spec.horizon_years, chosen, tuple(cands), _assumptions(spec, cands))
