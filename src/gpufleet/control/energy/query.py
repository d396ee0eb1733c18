"""Energy reports from the stored minutes (`gpufleet.control.db.models.EnergyMinute`): sums per
node, tenant, GPU model or day in SQL, per job from the jobs' allocations (node, GPU indexes,
start and end), with kWh, cost (``energy_price_per_kwh``) and CO2 (``grid_gco2_per_kwh``)
from the policy, and the idle waste (in-service GPUs below ``idle_util_pct``).

A tenant token reads only its own tenant's energy: minutes measured while the node belonged
to it, and its own jobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select
from sqlalchemy.sql.elements import ColumnElement

from gpufleet.control.db.models import EnergyMinute
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore
    from gpufleet.schedulers.base import SchedulerBackend

BY = ("job", "tenant", "node", "model", "day")
J_PER_KWH = 3.6e6
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
MAX_SINCE_S = 366 * 86400.0


def parse_since(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` as seconds; a clear error otherwise."""
    m = _SINCE.match(text)
    if m is None:
        raise UsageError(
            f"since: {text[:60]!r} is not a duration; use a number and a unit s, m, h, d or w "
            "(e.g. 30d, 12h)"
        )
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < seconds <= MAX_SINCE_S:
        raise UsageError(f"since: {text!r} must be more than 0 and at most 366d")
    return seconds


def _energy_expr() -> ColumnElement[float]:
    """A minute's joules in SQL (`energy_ledger.minute_joules`)."""
    e = EnergyMinute
    return e.window_j + case(
        (e.power_s > e.window_s, e.power_j * (e.power_s - e.window_s) / e.power_s),
        else_=0.0,
    )


@dataclass
class Sums:
    """Joules of one group: all, counter-measured part, idle part and idle GPU-seconds."""

    joules: float = 0.0
    counter_j: float = 0.0
    idle_j: float = 0.0
    idle_s: float = 0.0
    gpu_s: float = 0.0

    def add(self, other: Sums, weight: float = 1.0) -> None:
        self.joules += other.joules * weight
        self.counter_j += other.counter_j * weight
        self.idle_j += other.idle_j * weight
        self.idle_s += other.idle_s * weight
        self.gpu_s += other.gpu_s * weight


def figures(s: Sums, policy: RemediationPolicy) -> dict[str, Any]:
    """kWh, cost and CO2 of a sum (cost or CO2 absent when the policy has no price or
    intensity), the method (``counter``, ``power`` or ``mixed``) and the idle waste."""
    kwh = s.joules / J_PER_KWH
    idle_kwh = s.idle_j / J_PER_KWH
    share = s.counter_j / s.joules if s.joules > 0 else None
    method = None
    if share is not None:
        method = "counter" if share >= 0.99 else "power" if share <= 0.01 else "mixed"
    out: dict[str, Any] = {
        "kwh": kwh,
        "gpu_hours": s.gpu_s / 3600.0,
        "method": method,
        "counter_share": share,
        "idle_kwh": idle_kwh,
        "idle_gpu_hours": s.idle_s / 3600.0,
    }
    price, grid = policy.energy_price_per_kwh, policy.grid_gco2_per_kwh
    if price is not None:
        out["cost"] = kwh * price
        out["idle_cost"] = idle_kwh * price
    if grid is not None:
        out["co2_kg"] = kwh * grid / 1000.0
    return out


def _scoped(q: Any, who: Principal) -> Any:
    if who.tenant is not None:
        q = q.where(EnergyMinute.tenant == who.tenant)
    return q


def _sums_row(joules: Any, counter_j: Any, idle_j: Any, idle_s: Any, gpu_s: Any) -> Sums:
    return Sums(
        float(joules or 0.0),
        float(counter_j or 0.0),
        float(idle_j or 0.0),
        float(idle_s or 0.0),
        float(gpu_s or 0.0),
    )


def _aggregates() -> tuple[Any, ...]:
    e = EnergyMinute
    covered = case((e.power_s > e.window_s, e.power_s), else_=e.window_s)
    return (
        func.sum(_energy_expr()),
        func.sum(e.window_j - e.fallback_j),
        func.sum(e.idle_j),
        func.sum(e.idle_s),
        func.sum(covered),
    )


def grouped(store: ControlStore, who: Principal, by: str, since_s: float) -> dict[str, Sums]:
    """Sums per node, tenant, model or day over the minutes from ``since_s``."""
    e = EnergyMinute
    key: Any = {
        "node": e.node,
        "tenant": e.tenant,
        "model": e.model,
        "day": e.minute_s // 86400,  # floor division in SQL on both dialects
    }[by]
    q = select(key, *_aggregates()).where(e.minute_s >= since_s).group_by(key)
    out: dict[str, Sums] = {}
    with store.sessions() as s:
        for k, *vals in s.execute(_scoped(q, who)):
            name = _day(int(k)) if by == "day" else ("(none)" if k is None else str(k))
            out[name] = _sums_row(*vals)
    return out


def total(store: ControlStore, who: Principal, since_s: float) -> Sums:
    e = EnergyMinute
    q = select(*_aggregates()).where(e.minute_s >= since_s)
    with store.sessions() as s:
        row = s.execute(_scoped(q, who)).one()
    return _sums_row(*row)


def _day(day: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(day * 86400, dt.UTC).strftime("%Y-%m-%d")


# -- jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Where and when a job ran: GPU indexes per node, from ``start_s`` to ``end_s``."""

    job: str
    tenant: str
    name: str
    placement: tuple[tuple[str, tuple[int, ...]], ...]
    start_s: float
    end_s: float | None


def embedded_allocations(store: ControlStore) -> list[Allocation]:
    """The embedded scheduler's attempts (``sched_attempts``: nodes, per-node GPU indexes,
    start, end) with their job's tenant and name."""
    from gpufleet.schedulers.embedded.store import sched_attempts, sched_jobs

    a, j = sched_attempts, sched_jobs
    q = select(
        a.c.job_seq, a.c.nodes, a.c.gpus, a.c.started_at, a.c.ended_at, j.c.tenant, j.c.name
    ).join(j, j.c.seq == a.c.job_seq)
    out = []
    with store.sessions() as s:
        for seq, nodes, gpus, start, end, tenant, name in s.execute(q):
            if start is None:
                continue
            per_node = json.loads(gpus)
            names = json.loads(nodes)
            placement = tuple(
                (str(n), tuple(int(i) for i in (per_node[k] if k < len(per_node) else [])))
                for k, n in enumerate(names)
            )
            out.append(Allocation(str(seq), tenant, name, placement, float(start), end))
    return out


def backend_allocations(scheduler: SchedulerBackend) -> list[Allocation]:
    """Jobs of an external scheduler (Slurm: the GRES indexes ``IDX:`` of its job details) as
    it lists them now; the same indexes on each of a job's nodes."""
    out = []
    for js in scheduler.list_jobs():
        if js.started_at_s is None or not js.gpus:
            continue
        placement = tuple((n, tuple(js.gpus)) for n in js.nodes)
        out.append(
            Allocation(
                js.id, js.spec.tenant, js.spec.name, placement, js.started_at_s, js.ended_at_s
            )
        )
    return out


def allocations(store: ControlStore, scheduler: SchedulerBackend | None) -> list[Allocation]:
    if scheduler is not None and scheduler.name != "embedded" and scheduler.name != "none":
        try:
            return backend_allocations(scheduler)
        except Exception:  # the scheduler does not answer: no job figures, not a failure
            return []
    return embedded_allocations(store)


def job_sums(store: ControlStore, allocs: Iterable[Allocation], now_s: float) -> dict[str, Sums]:
    """Each job's energy: its GPUs' minutes between its start and end; of a minute the job
    held in part, the GPU's mean power over the minute's measured seconds times the seconds
    the job held it (several attempts add up)."""
    e = EnergyMinute
    out: dict[str, Sums] = {}
    with store.sessions() as s:
        for al in allocs:
            end = al.end_s if al.end_s is not None else now_s
            acc = out.setdefault(al.job, Sums())
            for node, gpus in al.placement:
                if not gpus or end <= al.start_s:
                    continue
                first = int(al.start_s // 60 * 60)
                q = (
                    select(e.minute_s, *_aggregates())
                    .where(e.node == node, e.gpu_index.in_(gpus))
                    .where(e.minute_s >= first, e.minute_s < end)
                    .group_by(e.minute_s, e.gpu_index)
                )
                for minute, *vals in s.execute(q):
                    row = _sums_row(*vals)
                    lo, hi = max(al.start_s, minute), min(end, minute + 60)
                    if hi > lo and row.gpu_s > 0:
                        # the GPU's mean power over the measured part of the minute, for the
                        # part the job held it
                        acc.add(row, min(hi - lo, row.gpu_s) / row.gpu_s)
    return out


def report(
    store: ControlStore,
    who: Principal,
    by: str,
    since_s: float,
    now_s: float,
    scheduler: SchedulerBackend | None = None,
) -> dict[str, Any]:
    """The energy report: rows per ``by`` key, the total and the idle waste."""
    if by not in BY:
        raise UsageError(f"by: {by!r} is not one of {', '.join(BY)}")
    policy = store.view.policy
    start = now_s - since_s
    rows: list[dict[str, Any]] = []
    if by == "job":
        allocs = [a for a in allocations(store, scheduler) if a.end_s is None or a.end_s > start]
        if who.tenant is not None:
            allocs = [a for a in allocs if a.tenant == who.tenant]
        meta = {a.job: a for a in allocs}
        clipped = [
            Allocation(a.job, a.tenant, a.name, a.placement, max(a.start_s, start), a.end_s)
            for a in allocs
        ]
        tot = Sums()  # the listed jobs' energy, not the GPUs' (a tenant's jobs on shared nodes)
        for job, sums in job_sums(store, clipped, now_s).items():
            a = meta[job]
            rows.append({"key": job, "tenant": a.tenant, "name": a.name, **figures(sums, policy)})
            tot.add(sums, 1.0)
    else:
        for key, sums in grouped(store, who, by, start).items():
            rows.append({"key": key, **figures(sums, policy)})
        tot = total(store, who, start)  # every GPU minute the token may read
    rows.sort(key=lambda r: (-r["kwh"], r["key"]))
    return {
        "by": by,
        "since_s": start,
        "until_s": now_s,
        "currency": policy.energy_currency,
        "price_per_kwh": policy.energy_price_per_kwh,
        "grid_gco2_per_kwh": policy.grid_gco2_per_kwh,
        "idle_util_pct": policy.idle_util_pct,
        "rows": rows,
        "total": figures(tot, policy),
    }


def job_energy(
    store: ControlStore, job_id: str, scheduler: SchedulerBackend | None, now_s: float
) -> dict[str, Any] | None:
    """One job's energy figures, None when nothing is known of it."""
    allocs = [a for a in allocations(store, scheduler) if a.job == job_id]
    if not allocs:
        return None
    sums = job_sums(store, allocs, now_s).get(job_id)
    if sums is None or sums.gpu_s <= 0:
        return None
    out = figures(sums, store.view.policy)
    out["currency"] = store.view.policy.energy_currency
    return out
