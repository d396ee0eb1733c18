"""Jobs' own progress (issue 31): the work a job has done so far, as it reports it, and its rate
over a window, the throughput a power order's slowdown is measured by.

A job (or its wrapper) posts its cumulative work done in its own unit (samples, steps,
tokens...) to ``POST /api/v1/energy/progress``; readings closer than `MIN_INTERVAL_S` to the
job's previous one are not stored, so a job posting every step costs a row per 10 s at most.
The rate over a window is the work added between the window's first and last reading over the
time between them; a lower reading than the one before (a job restarted from a checkpoint) adds
nothing for that step. Nothing reported: the rate is unknown (None), never 0. Readings are
kept as long as the energy minutes (``energy_retention``; `gpufleet.control.state.energy_store`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from gpufleet.control.db.models import JobProgress
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import NotFound
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gpufleet.control.state.store import ControlStore
    from gpufleet.schedulers.base import SchedulerBackend

MIN_INTERVAL_S = 10.0  # a job's readings closer than this to its previous one are not stored
FUTURE_SLACK_S = 60.0  # a reading's time may run this far ahead of the controller's clock


class ProgressIn(BaseModel):
    """``POST /api/v1/energy/progress``: a job's work done so far, in its own unit."""

    model_config = ConfigDict(extra="forbid")

    job: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]
    done: Annotated[float, Field(ge=0, le=1e18, allow_inf_nan=False)]
    unit: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_./%\-]+$")]
    at_s: Annotated[float | None, Field(ge=0, le=1e11, allow_inf_nan=False)] = None


@dataclass(frozen=True)
class Rate:
    """A job's rate over a window: work per second, its unit, and the readings it rests on."""

    per_s: float
    unit: str
    readings: int


def record(
    store: ControlStore,
    body: ProgressIn,
    who: Principal,
    scheduler: SchedulerBackend | None,
) -> bool:
    """Store a job's reading; False when it is within `MIN_INTERVAL_S` of its previous one. The
    job must be one the controller knows (a tenant token: of its own tenant)."""
    from gpufleet.control.energy.query import allocations

    now = store.clock()
    at = now if body.at_s is None else body.at_s
    if at > now + FUTURE_SLACK_S:
        raise UsageError(f"at_s: {at:.0f} is ahead of the controller's clock ({now:.0f})")
    tenant = None
    for a in allocations(store, scheduler):
        if a.job == body.job:
            tenant = a.tenant
            break
    else:
        raise NotFound(f"job {body.job!r} not found (or it never started)")
    if not who.is_global and tenant != who.tenant:
        raise NotFound(f"job {body.job!r} not found (or it never started)")
    return store.writer.call(lambda: _store(store, body, at, tenant))


def _store(store: ControlStore, body: ProgressIn, at: float, tenant: str | None) -> bool:
    with store.sessions.begin() as s:
        last = s.execute(
            select(JobProgress.t_s, JobProgress.unit)
            .where(JobProgress.job == body.job)
            .order_by(JobProgress.t_s.desc())
            .limit(1)
        ).first()
        if last is not None:
            if last.unit != body.unit:
                raise UsageError(
                    f"unit: job {body.job} reports its progress in {last.unit!r}, not {body.unit!r}"
                )
            if abs(at - last.t_s) < MIN_INTERVAL_S:
                return False
        if s.get(JobProgress, (body.job, at)) is not None:
            return False
        s.add(JobProgress(job=body.job, t_s=at, done=body.done, unit=body.unit, tenant=tenant))
    return True


def rate(s: Session, job: str, lo: float, hi: float) -> Rate | None:
    """The job's rate between ``lo`` and ``hi`` from its readings in that window (inclusive);
    None with fewer than two readings or none of them apart in time."""
    rows = s.execute(
        select(JobProgress.t_s, JobProgress.done, JobProgress.unit)
        .where(JobProgress.job == job, JobProgress.t_s >= lo, JobProgress.t_s <= hi)
        .order_by(JobProgress.t_s)
    ).all()
    if len(rows) < 2:
        return None
    span = rows[-1].t_s - rows[0].t_s
    if span <= 0:
        return None
    work = sum(max(0.0, b.done - a.done) for a, b in itertools.pairwise(rows))
    per_s = work / span
    if not math.isfinite(per_s):
        return None
    return Rate(per_s, rows[-1].unit, len(rows))
