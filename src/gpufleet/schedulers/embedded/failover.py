"""Failover: move the jobs of a lost or fail-drained node elsewhere, never running one twice.

Rules (issues 7 and 12, "Failover"):
- A job on a node that goes ``lost`` or is drained for a fail finding (or whose copy the node
  killed: a fallen GPU, fencing) is requeued with the same spec (so the same checkpoint
  directory) and ``requeues + 1``: an infrastructure requeue, capped by ``max_requeues``, that
  never consumes the job's own restart budget. A copy that exits non-zero is restarted with
  ``restarts + 1`` while ``restarts < max_restarts``, else the job fails. The next copy sees
  ``restarts + requeues`` (every earlier copy) as ``GPUFLEET_RESTART_COUNT``.
- Fencing: every placement has a new generation. Before requeueing, the old copy is killed. The
  new copy starts only once the old one is known dead: either the agent's report shows it ended
  (positive confirmation, checked at every tick: ``release_confirmed``; an agent that answers
  gets the kill on its next exchange and reports it on the one after), or, for an agent that
  does not answer, once its lease has surely run out (last contact + ``lease_s``: the agent
  kills its own jobs by then). When the node comes back, ``fence`` kills whatever stale copy it
  still runs.
- Restart reconciliation: the store is the truth. A restarted engine asks each reachable agent
  what runs: copies it confirms are adopted, finished ones are recorded, missing ones are requeued,
  and anything not current is killed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from gpufleet.schedulers.base import JobState
from gpufleet.schedulers.embedded.executor import CopyReport, NodeUnreachable
from gpufleet.schedulers.embedded.store import JobRow

if TYPE_CHECKING:
    from gpufleet.schedulers.embedded.engine import EmbeddedScheduler

ACTIVE = (JobState.STARTING, JobState.RUNNING)
WAITING = (JobState.QUEUED, JobState.REQUEUED)

# What a requeue consumes: ``requeue`` (infrastructure: node lost, fail finding, fencing;
# capped by ``max_requeues``), ``restart`` (the job's own non-zero exit; ``max_restarts``) or
# ``none`` (asked by an operator, or never started).
Budget = Literal["requeue", "restart", "none"]


def fence_deadline(eng: EmbeddedScheduler, nodes: tuple[str, ...]) -> float:
    """The earliest time by which every agent of ``nodes`` has surely killed its copies."""
    last = max(eng.last_contact.get(n, eng.started_at) for n in nodes)
    return last + eng.executor.lease_s


def kill_copies(eng: EmbeddedScheduler, job: JobRow, skip: str | None = None) -> bool:
    """Kill every copy of the job's current generation; True when all kills are confirmed."""
    confirmed = True
    for node in job.nodes:
        if node == skip:
            continue
        try:
            ok = eng.executor.kill(job.id, job.generation, node)
        except NodeUnreachable:
            ok = False
        confirmed = confirmed and ok
    return confirmed


def requeue(
    eng: EmbeddedScheduler,
    job: JobRow,
    now: float,
    reason: str,
    *,
    faulty_node: str | None = None,
    budget: Budget = "requeue",
    confirmed: bool | None = None,
) -> JobRow | None:
    """Kill the job's copies and put it back in the queue (or fail it: its budget is used up)."""
    if confirmed is None:
        confirmed = kill_copies(eng, job)
    not_before = now if confirmed else max(now, fence_deadline(eng, job.nodes))
    spec = job.spec
    if budget == "restart" and job.restarts >= spec.max_restarts:
        why = f"{reason}; no restarts left (max_restarts={spec.max_restarts})"
    elif budget == "requeue" and job.requeues >= spec.max_requeues:
        why = f"{reason}; no requeues left (max_requeues={spec.max_requeues})"
    else:
        why = ""
    if why:
        new = replace(job, state=JobState.FAILED, ended_at=now, reason=why)
        return eng.transition(job, new, now, f"failed: {reason}")
    excluded = job.excluded
    if faulty_node is not None and faulty_node not in excluded:
        excluded = (*excluded, faulty_node)
    new = replace(
        job,
        state=JobState.REQUEUED,
        restarts=job.restarts + (budget == "restart"),
        requeues=job.requeues + (budget == "requeue"),
        not_before=not_before,
        reason=reason,
        excluded=excluded,
    )
    return eng.transition(job, new, now, f"requeued: {reason}")


def copies_gone(eng: EmbeddedScheduler, job: JobRow) -> bool:
    """Does every agent of the job's last placement now report that copy ended?

    Positive confirmation only: an executor that cannot tell (no ``copy_gone``) or a node that
    does not answer gives False, and the fencing deadline decides."""
    gone = getattr(eng.executor, "copy_gone", None)
    if gone is None or not job.nodes:
        return False
    try:
        return all(bool(gone(job.id, job.generation, n)) for n in job.nodes)
    except NodeUnreachable:
        return False


def release_confirmed(eng: EmbeddedScheduler, now: float) -> list[str]:
    """Waiting jobs held back for an unconfirmed kill whose agents now report the old copy
    ended: they may start now. Returns their ids."""
    released = []
    for job in eng.store.jobs(WAITING):
        if job.not_before <= now or job.generation == 0 or not copies_gone(eng, job):
            continue
        new = replace(job, not_before=now, reason="old copy confirmed ended: starting again")
        if eng.transition(job, new, now) is not None:
            released.append(job.id)
    return released


def on_node_failure(eng: EmbeddedScheduler, node: str, now: float, reason: str) -> list[str]:
    """Requeue every job with a copy on ``node``; return their ids."""
    moved = []
    for job in eng.store.jobs(ACTIVE):
        if node in job.nodes:
            confirmed = kill_copies(eng, job)
            if requeue(eng, job, now, reason, faulty_node=node, confirmed=confirmed):
                moved.append(job.id)
    return moved


def reconcile(eng: EmbeddedScheduler, now: float) -> None:
    """After a (re)start: make the store and the agents agree (see the module docstring)."""
    nodes = eng.store.nodes()
    reports: dict[str, list[CopyReport] | None] = {}
    for name in nodes:
        try:
            reports[name] = eng.executor.poll(name)
            eng.last_contact[name] = now
        except NodeUnreachable:
            reports[name] = None
    for job in eng.store.jobs(ACTIVE):
        failed_nodes = [
            n for n in job.nodes if n in nodes and (nodes[n].state == "lost" or nodes[n].fail)
        ]
        if failed_nodes:  # the previous engine died half-way through a failover
            requeue(eng, job, now, f"node {failed_nodes[0]} failed", faulty_node=failed_nodes[0])
            continue
        if any(reports.get(n) is None for n in job.nodes):
            continue  # cannot see it now; node_lost will handle it if the node is gone
        mine = {
            r.node: r
            for n in job.nodes
            for r in reports[n] or []
            if r.job_id == job.id and r.generation == job.generation
        }
        if job.state == JobState.STARTING and not mine:
            # The previous engine decided to start it but died before the agent heard of it.
            back = replace(job, state=JobState.REQUEUED if job.restarts else JobState.QUEUED)
            eng.transition(job, back, now, "not started: scheduler restarted")
            continue
        eng.settle(job, mine, now)
    for name, reps in reports.items():
        if reps is not None and nodes[name].state != "lost":
            eng.fence_node(name)
