"""A job as the REST API and the CLI show it (`gpufleet.wire.views.JobOut`, `JobDetail`), made
from any backend's `JobStatus` and `JobAttempt` records: one shape whether the job was read
from a controller (``GET /api/v1/jobs/{id}``) or from a local scheduler state directory
(``gpufleet jobs show`` without ``--controller``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.schedulers.base import JobAttempt, JobStatus
from gpufleet.wire.views import AttemptOut, JobDetail, JobOut


def job_out(j: JobStatus) -> JobOut:
    """The job in lists (``gpus``: what it asks for, per node x nodes)."""
    return JobOut(
        id=j.id,
        name=j.spec.name,
        tenant=j.spec.tenant,
        state=j.state.value,
        nodes=list(j.nodes),
        gpus=j.spec.gpus * j.spec.nodes,
        restarts=j.restarts,
        requeues=j.requeues,
        exit_code=j.exit_code,
        reason=j.reason,
        priority=j.spec.priority,
        submitted_at_s=j.submitted_at_s,
        started_at_s=j.started_at_s,
        ended_at_s=j.ended_at_s,
    )


def job_detail(
    j: JobStatus,
    attempts: Iterable[JobAttempt],
    *,
    energy: dict[str, Any] | None = None,
    log: str | None = None,
) -> JobDetail:
    """The job with its spec and every attempt; ``energy`` (the controller's accounting) and
    ``log`` (a local scheduler's log file of the newest copy) where known."""
    s = j.spec
    return JobDetail(
        **job_out(j).model_dump(),
        command=list(s.command),
        image=s.image,
        gpus_per_node=s.gpus,
        node_count=s.nodes,
        gpu_indexes=list(j.gpus),
        gpu_model=s.gpu_model,
        max_restarts=s.max_restarts,
        max_requeues=s.max_requeues,
        checkpoint_dir=s.checkpoint_dir,
        attempts=[
            AttemptOut(
                generation=a.generation,
                nodes=list(a.nodes),
                started_at_s=a.started_at_s,
                ended_at_s=a.ended_at_s,
                outcome=a.outcome,
            )
            for a in attempts
        ],
        energy=energy,
        log=log,
    )
