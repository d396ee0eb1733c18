"""Failover: move the jobs of a lost or fail-drained node elsewhere, never running one twice.

Rules (issue 7, "Failover"):
- A job on a node that goes ``lost`` or is drained for a fail finding is requeued with the same
  spec (so the same checkpoint directory) and ``restarts + 1``, which the next copy sees as
  ``GPUFLEET_RESTART_COUNT``; once ``max_restarts`` is used up it fails instead.
- Fencing: every placement has a new generation. Before requeueing, the old copy is killed; when
  the kill cannot be confirmed (the agent is unreachable) the job may only start again after the
  agent's lease has surely run out (last contact + ``lease_s``: the agent kills its own jobs by
  then). When the node comes back, ``fence`` kills whatever stale copy it still runs.
- Restart reconciliation: the store is the truth. A restarted engine asks each reachable agent
  what runs: copies it confirms are adopted, finished ones are recorded, missing ones are requeued,
  and anything not current is killed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpufleet.schedulers.base import JobState
from gpufleet.schedulers.embedded.executor import CopyReport, NodeUnreachable
from gpufleet.schedulers.embedded.store import JobRow

if TYPE_CHECKING:
    from gpufleet.schedulers.embedded.engine import EmbeddedScheduler

ACTIVE = (JobState.STARTING, JobState.RUNNING)
WAITING = (JobState.QUEUED, JobState.REQUEUED)


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
    count_restart: bool = True,
    enforce_max: bool = True,
    confirmed: bool | None = None,
) -> JobRow | None:
    """Kill the job's copies and put it back in the queue (or fail it: no restarts left)."""
    if confirmed is None:
        confirmed = kill_copies(eng, job)
    not_before = now if confirmed else max(now, fence_deadline(eng, job.nodes))
    outcome = f"requeued: {reason}"
    if count_restart and enforce_max and job.restarts >= job.spec.max_restarts:
        new = replace(
            job,
            state=JobState.FAILED,
            ended_at=now,
            reason=f"{reason}; no restarts left (max_restarts={job.spec.max_restarts})",
        )
        outcome = f"failed: {reason}"
    else:
        excluded = job.excluded
        if faulty_node is not None and faulty_node not in excluded:
            excluded = (*excluded, faulty_node)
        new = replace(
            job,
            state=JobState.REQUEUED,
            restarts=job.restarts + (1 if count_restart else 0),
            not_before=not_before,
            reason=reason,
            excluded=excluded,
        )
    return eng.transition(job, new, now, outcome)


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
