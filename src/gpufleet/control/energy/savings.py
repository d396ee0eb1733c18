"""What a power order saved (issue 31): each GPU it set, its measured mean power in the hour
before the order against during it, and the jobs' throughput over the same windows.

The comparison, per GPU the order set (its agent reported it ``ok``), on whole minutes of the
energy ledger (`gpufleet.control.db.models.EnergyMinute`):

- the minute in which the limit took effect (the agent's ``done_s``) holds both limits and is
  left out; the *before* window is the `BASELINE_S` before that minute, the *during* window the
  minutes after it until the limits were put back (the node's restore report) or now;
- *the same jobs*: a GPU a job held when the limit took effect is compared only while that job
  held it (both windows clipped to the job's start and end), so another workload never stands
  in for the baseline; a GPU no job held is compared as itself while no job held it (from the
  end of the job before to the start of the next; basis ``gpu``, the workload unknown);
- another order's limit change on the node (its apply or restore) bounds both windows, so the
  baseline is always one limit, the one this order replaced;
- mean power = the window's joules over its measured GPU-seconds; energy saved = (before -
  during) x the measured GPU-seconds during; cost = that x the policy's
  ``energy_price_per_kwh`` (absent without a price);
- the slowdown is 1 - (job's rate during / rate before) from the progress the job reported
  (`gpufleet.control.energy.progress`), GPU-seconds weighted across jobs; a job that reported
  none has an unknown slowdown (None), never 0. With it, energy per unit of work before and
  during, and the energy saved for the same work (what the work done during would have cost at
  the baseline's energy per unit).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from gpufleet.control.db.models import EnergyMinute, PowerOrder, PowerOrderNode
from gpufleet.control.energy import progress
from gpufleet.control.energy.query import (
    J_PER_KWH,
    Allocation,
    Sums,
    _aggregates,
    _sums_row,
    allocations,
)
from gpufleet.control.state.auth import Principal

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gpufleet.control.state.remediation import RemediationPolicy
    from gpufleet.control.state.store import ControlStore
    from gpufleet.schedulers.base import SchedulerBackend

BASELINE_S = 3600.0  # the before window: the hour before the minute the limit took effect
MINUTE = 60.0
NOT_COMPARED_SHOWN = 20
ORDERS_SHOWN = 50


def _floor(t: float) -> float:
    return math.floor(t / MINUTE) * MINUTE


def _ceil(t: float) -> float:
    return math.ceil(t / MINUTE) * MINUTE


def _effective_s(doc: dict[str, Any] | None, received_s: float | None) -> float | None:
    """When the agent set (or put back) the limits: its ``done_s`` (the clock its samples are
    stamped with) when it is plausible, else when the controller got the report."""
    if received_s is None:
        return None
    done = (doc or {}).get("done_s")
    if isinstance(done, (int, float)) and math.isfinite(done) and done <= received_s + MINUTE:
        return float(done)
    return received_s


@dataclass
class _Gpu:
    node: str
    gpu: int
    job: Allocation | None
    before: tuple[float, float]
    during: tuple[float, float]
    b: Sums = field(default_factory=Sums)
    d: Sums = field(default_factory=Sums)

    @property
    def before_w(self) -> float:
        return self.b.joules / self.b.gpu_s

    @property
    def during_w(self) -> float:
        return self.d.joules / self.d.gpu_s


def _holder(allocs: list[Allocation], node: str, gpu: int, at: float) -> Allocation | None:
    for a in allocs:
        running = a.start_s <= at and (a.end_s is None or a.end_s > at)
        if running and any(n == node and gpu in gpus for n, gpus in a.placement):
            return a
    return None


def _idle_span(
    allocs: list[Allocation], node: str, gpu: int, at: float, now_s: float
) -> tuple[float, float]:
    """Around ``at``, when no job held the GPU: from the end of the last job before to the
    start of the next one after (its workload then stays the same one, unknown)."""
    lo, hi = -math.inf, math.inf
    for a in allocs:
        if not any(n == node and gpu in gpus for n, gpus in a.placement):
            continue
        end = a.end_s if a.end_s is not None else now_s
        if end <= at:
            lo = max(lo, end)
        elif a.start_s > at:
            hi = min(hi, a.start_s)
    return lo, hi


def _changes(s: Session, oid: int, nodes: list[str]) -> dict[str, list[float]]:
    """Per node, when other orders changed its limits (their applies and restores)."""
    out: dict[str, list[float]] = defaultdict(list)
    q = select(PowerOrderNode).where(PowerOrderNode.node.in_(nodes), PowerOrderNode.order_id != oid)
    for pn in s.scalars(q):
        for t in (
            _effective_s(pn.applied, pn.applied_s),
            _effective_s(pn.restored, pn.restored_s),
        ):
            if t is not None:
                out[pn.node].append(t)
    return out


def _sums(s: Session, gpus: list[_Gpu], which: str) -> None:
    """Fill each GPU's before (``b``) or during (``d``) sums: one grouped query per window."""
    groups: dict[tuple[float, float], list[_Gpu]] = defaultdict(list)
    for g in gpus:
        lo, hi = g.before if which == "b" else g.during
        if hi > lo:
            groups[(lo, hi)].append(g)
    e = EnergyMinute
    for (lo, hi), members in groups.items():
        wanted = {(g.node, g.gpu): g for g in members}
        q = (
            select(e.node, e.gpu_index, *_aggregates())
            .where(e.node.in_(sorted({g.node for g in members})))
            .where(e.minute_s >= lo, e.minute_s < hi)
            .group_by(e.node, e.gpu_index)
        )
        for node, index, *vals in s.execute(q):
            hit = wanted.get((node, int(index)))
            if hit is not None:
                setattr(hit, which, _sums_row(*vals))


def _gpus(
    s: Session,
    po: PowerOrder,
    rows: list[PowerOrderNode],
    allocs: list[Allocation],
    now_s: float,
    since_s: float | None,
) -> tuple[list[_Gpu], list[dict[str, Any]]]:
    """The GPUs to compare with their windows, and those that cannot be (with why)."""
    changes = _changes(s, po.id, [pn.node for pn in rows])
    out: list[_Gpu] = []
    skipped: list[dict[str, Any]] = []
    for pn in rows:
        applied = _effective_s(pn.applied, pn.applied_s)
        if applied is None:
            skipped.append({"node": pn.node, "gpu": None, "reason": "no agent report yet"})
            continue
        end = _effective_s(pn.restored, pn.restored_s)
        end = now_s if end is None else min(end, now_s)
        cut = _floor(applied)
        lo, hi = cut - BASELINE_S, _floor(end)
        for t in changes.get(pn.node, []):
            if t < applied:
                lo = max(lo, _ceil(t))
            else:
                hi = min(hi, _floor(t))
        start = cut + MINUTE if since_s is None else max(cut + MINUTE, _ceil(since_s))
        for g in (pn.applied or {}).get("gpus") or []:
            if not g.get("ok"):
                skipped.append(
                    {"node": pn.node, "gpu": g["gpu"], "reason": "its limit was not set"}
                )
                continue
            job = _holder(allocs, pn.node, int(g["gpu"]), applied)
            b_lo, d_hi = lo, hi
            if job is not None:
                b_lo = max(b_lo, _ceil(job.start_s))
                d_hi = min(d_hi, _floor(job.end_s if job.end_s is not None else now_s))
            else:
                after, until = _idle_span(allocs, pn.node, int(g["gpu"]), applied, now_s)
                b_lo = max(b_lo, _ceil(after)) if math.isfinite(after) else b_lo
                d_hi = min(d_hi, _floor(until)) if math.isfinite(until) else d_hi
            out.append(_Gpu(pn.node, int(g["gpu"]), job, (b_lo, cut), (start, d_hi)))
    _sums(s, out, "b")
    _sums(s, out, "d")
    kept = []
    for g in out:
        if g.b.gpu_s <= 0:
            reason = "no energy measured in the baseline window"
        elif g.d.gpu_s <= 0:
            reason = "no energy measured during the order yet"
        else:
            kept.append(g)
            continue
        skipped.append({"node": g.node, "gpu": g.gpu, "reason": reason})
    return kept, skipped


def _job_rows(s: Session, gpus: list[_Gpu]) -> list[dict[str, Any]]:
    """Per job held on the compared GPUs: its rates, slowdown and energy per unit of work over
    the windows all its GPUs share (the time none of them was capped, the time all were)."""
    by: dict[str, list[_Gpu]] = defaultdict(list)
    for g in gpus:
        if g.job is not None:
            by[g.job.job].append(g)
    out = []
    for job, members in sorted(by.items()):
        b_lo, b_hi = max(g.before[0] for g in members), min(g.before[1] for g in members)
        d_lo, d_hi = max(g.during[0] for g in members), min(g.during[1] for g in members)
        rb = progress.rate(s, job, b_lo, b_hi) if b_hi > b_lo else None
        rd = progress.rate(s, job, d_lo, d_hi) if d_hi > d_lo else None
        if rb is not None and rd is not None and rb.unit != rd.unit:
            rd = None
        seen = rb if rb is not None else rd
        row: dict[str, Any] = {
            "job": job,
            "name": members[0].job.name if members[0].job else None,
            "gpus": len(members),
            "unit": None if seen is None else seen.unit,
            "rate_before": None if rb is None else rb.per_s,
            "rate_during": None if rd is None else rd.per_s,
            "slowdown": None,
            "energy_per_unit_before_j": None,
            "energy_per_unit_during_j": None,
            "_gpu_s": sum(g.d.gpu_s for g in members),
            "_same_work_j": None,
            "_baseline_work_j": None,
        }
        if rb is not None and rd is not None and rb.per_s > 0:
            row["slowdown"] = 1.0 - rd.per_s / rb.per_s
            pb, pd = sum(g.before_w for g in members), sum(g.during_w for g in members)
            epb = pb / rb.per_s
            row["energy_per_unit_before_j"] = epb
            if rd.per_s > 0:
                epd = pd / rd.per_s
                row["energy_per_unit_during_j"] = epd
                work = rd.per_s * (row["_gpu_s"] / len(members))  # work done during
                row["_baseline_work_j"] = work * epb
                row["_same_work_j"] = work * epb - work * epd
        out.append(row)
    return out


def _empty(policy: RemediationPolicy) -> dict[str, Any]:
    return {
        "baseline_s": BASELINE_S,
        "currency": policy.energy_currency,
        "basis": None,
        "gpus": 0,
        "before": None,
        "during": None,
        "before_w": None,
        "during_w": None,
        "gpu_hours": None,
        "saved_kwh": None,
        "saved_kwh_per_gpu_hour": None,
        "slowdown": None,
        "slowdown_gpus": 0,
        "energy_per_work_saved": None,
        "saved_kwh_same_work": None,
        "jobs": [],
    }


def order_savings(
    s: Session,
    po: PowerOrder,
    rows: list[PowerOrderNode],
    allocs: list[Allocation],
    policy: RemediationPolicy,
    now_s: float,
    since_s: float | None = None,
) -> dict[str, Any]:
    """One order's savings (module docstring); figures None when no GPU could be compared."""
    gpus, skipped = _gpus(s, po, rows, allocs, now_s, since_s)
    out = _empty(policy)
    out["not_compared"] = skipped[:NOT_COMPARED_SHOWN]
    out["not_compared_count"] = len(skipped)
    if not gpus:
        return out
    jb, sb = sum(g.b.joules for g in gpus), sum(g.b.gpu_s for g in gpus)
    jd, sd = sum(g.d.joules for g in gpus), sum(g.d.gpu_s for g in gpus)
    saved_j = sum((g.before_w - g.during_w) * g.d.gpu_s for g in gpus)
    jobs = _job_rows(s, gpus)
    held = sum(1 for g in gpus if g.job is not None)
    price = policy.energy_price_per_kwh
    out.update(
        basis="job" if held == len(gpus) else "gpu" if held == 0 else "mixed",
        gpus=len(gpus),
        before={"from_s": min(g.before[0] for g in gpus), "to_s": max(g.before[1] for g in gpus)},
        during={"from_s": min(g.during[0] for g in gpus), "to_s": max(g.during[1] for g in gpus)},
        before_w=jb / sb,
        during_w=jd / sd,
        gpu_hours=sd / 3600.0,
        saved_kwh=saved_j / J_PER_KWH,
        saved_kwh_per_gpu_hour=saved_j / J_PER_KWH / (sd / 3600.0),
    )
    if price is not None:
        out["cost_saved"] = out["saved_kwh"] * price
    known = [j for j in jobs if j["slowdown"] is not None]
    if known:
        weight = sum(j["_gpu_s"] for j in known)
        out["slowdown"] = sum(j["slowdown"] * j["_gpu_s"] for j in known) / weight
        out["slowdown_gpus"] = sum(j["gpus"] for j in known)
    same = [j for j in jobs if j["_same_work_j"] is not None]
    base = sum(j["_baseline_work_j"] for j in same)
    if same and base > 0:
        saved_same = sum(j["_same_work_j"] for j in same)
        out["energy_per_work_saved"] = saved_same / base
        out["saved_kwh_same_work"] = saved_same / J_PER_KWH
        if price is not None:
            out["cost_saved_same_work"] = out["saved_kwh_same_work"] * price
    out["jobs"] = [{k: v for k, v in j.items() if not k.startswith("_")} for j in jobs]
    return out


def in_window(
    store: ControlStore,
    who: Principal,
    since_s: float,
    now_s: float,
    scheduler: SchedulerBackend | None,
) -> list[dict[str, Any]]:
    """The orders ``who`` may read that were in force at some time from ``since_s`` (newest
    first), each with its savings over that part of it."""
    allocs = allocations(store, scheduler)
    policy = store.view.policy
    out = []
    with store.sessions() as s:
        q = (
            select(PowerOrder)
            .where(PowerOrder.created_s <= now_s)
            .order_by(PowerOrder.id.desc())
            .limit(ORDERS_SHOWN * 4)
        )
        if not who.is_global:
            q = q.where(PowerOrder.tenant == who.tenant)
        for po in s.scalars(q):
            rows = list(s.scalars(select(PowerOrderNode).where(PowerOrderNode.order_id == po.id)))
            ends = [r.restored_s for r in rows]
            if ends and all(e is not None and e < since_s for e in ends):
                continue  # put back before the window
            doc = order_savings(s, po, rows, allocs, policy, now_s, since_s)
            out.append({"order": po.id, "state": po.state, "spec": po.spec, **doc})
            if len(out) >= ORDERS_SHOWN:
                break
    return out


def attach(
    store: ControlStore,
    docs: list[dict[str, Any]],
    scheduler: SchedulerBackend | None,
) -> list[dict[str, Any]]:
    """Power-order status documents (`gpufleet.control.power.ops.status`) with each order's
    whole savings under ``savings``."""
    if not docs:
        return docs
    now = store.clock()
    allocs = allocations(store, scheduler)
    policy = store.view.policy
    with store.sessions() as s:
        for doc in docs:
            po = s.get(PowerOrder, doc["id"])
            if po is None:
                continue
            q = select(PowerOrderNode).where(PowerOrderNode.order_id == po.id)
            doc["savings"] = order_savings(s, po, list(s.scalars(q)), allocs, policy, now)
    return docs
