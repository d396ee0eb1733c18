"""The jobs API: ``/api/v1/jobs`` on whichever scheduler backend the controller runs.

| endpoint | role | what |
| --- | --- | --- |
| ``GET /jobs?state=&tenant=`` | viewer | ``{"jobs": [JobOut]}`` (oldest first) |
| ``POST /jobs`` | operator | submit (``JobIn``); 201 with the job |
| ``GET /jobs/{id}`` | viewer | the job, its spec and its attempts |
| ``POST /jobs/{id}/cancel`` | operator | cancel (kills its running copies) |
| ``GET /jobs/{id}/logs?tail=`` | viewer | the output of its newest copy |

A tenant-scoped token sees and touches only its tenant's jobs (others answer 404, so ids of other
tenants' jobs are not revealed) and submits only as its tenant. Every write is audited (refused
ones too). What the backend cannot do answers 501 with its reason from ``capabilities()``
(Kubernetes lists GPU pods but takes no jobs; ``--scheduler none`` has no jobs at all).
"""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from gpufleet.control.energy import query as energy_query
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.store import NotFound
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.schedulers.base import (
    Feature,
    JobState,
    JobStatus,
    SchedulerBackend,
    UnsupportedFeature,
)
from gpufleet.schedulers.views import job_detail, job_out
from gpufleet.wire.jobs import JOB_ID_PATTERN, MAX_JOB_ID, JobSubmit
from gpufleet.wire.views import JobDetail, JobList, JobOut, LogsOut

JobId = Annotated[str, Path(min_length=1, max_length=MAX_JOB_ID, pattern=JOB_ID_PATTERN)]


JobIn = JobSubmit  # the submission as it travels on the wire


def register(
    api: APIRouter, service: ControlService, need: Callable[[Role], Callable[..., Principal]]
) -> None:
    """Add the jobs endpoints to the ``/api/v1`` router."""
    store = service.store
    Viewer = Annotated[Principal, Depends(need(Role.VIEWER))]
    Operator = Annotated[Principal, Depends(need(Role.OPERATOR))]

    def backend(feature: Feature, doing: str) -> SchedulerBackend:
        """The scheduler, when it has ``feature`` (else 501 with the backend's reason)."""
        try:
            service.scheduler.capabilities().require(feature, doing)
        except UnsupportedFeature as exc:
            raise HTTPException(501, str(exc)) from exc
        return service.scheduler

    def visible(who: Principal, j: JobStatus) -> bool:
        return who.tenant is None or j.spec.tenant == who.tenant

    def get_job(who: Principal, job_id: str) -> JobStatus:
        try:
            j = backend(Feature.LIST_JOBS, "show a job").job(job_id)
        except UsageError as exc:
            raise NotFound(f"job {job_id!r} not found") from exc
        if not visible(who, j):
            raise NotFound(f"job {job_id!r} not found")
        return j

    def audited(who: Principal, action: str, target: str, detail: dict[str, Any]) -> None:
        store.record_audit(who, action, target, detail=detail)

    @api.get("/jobs", tags=["jobs"])
    def jobs_list(
        who: Viewer,
        state: Annotated[JobState | None, Query()] = None,
        tenant: Annotated[str | None, Query(max_length=100)] = None,
    ) -> JobList:
        """Jobs, oldest first (a tenant token sees its tenant's only)."""
        out = [
            job_out(j)
            for j in backend(Feature.LIST_JOBS, "list jobs").list_jobs()
            if visible(who, j)
            and (state is None or j.state is state)
            and (tenant is None or j.spec.tenant == tenant)
        ]
        return JobList(jobs=out)

    @api.post("/jobs", tags=["jobs"], status_code=201)
    def jobs_submit(body: JobIn, who: Operator) -> JobOut:
        """Submit a job; it is queued and placed by the scheduler."""
        tenant = body.tenant or who.tenant or "default"
        if who.tenant is not None and tenant != who.tenant:
            store.audit_refusal(who, "job.submit", body.name, f"token is bound to {who.tenant}")
            raise HTTPException(403, f"this token submits for tenant {who.tenant!r} only")
        if not body.command and not body.image:
            raise UsageError("command: give an argument list (or image)")
        spec = body.to_spec(tenant)
        jobs = backend(Feature.SUBMIT, "submit a job")
        try:
            jobs.capabilities().check_spec(spec)
            job_id = jobs.submit(spec)
        except GpufleetError as exc:
            store.audit_refusal(who, "job.submit", body.name, str(exc)[:500])
            raise UsageError(str(exc)) from exc
        audited(who, "job.submit", job_id, {"name": spec.name, "tenant": tenant})
        return job_out(jobs.job(job_id))

    @api.get("/jobs/{job_id}", tags=["jobs"])
    def jobs_show(job_id: JobId, who: Viewer) -> JobDetail:
        j = get_job(who, job_id)
        energy = energy_query.job_energy(store, j.id, service.scheduler, service.clock())
        return job_detail(j, service.scheduler.attempts(j.id), energy=energy)

    @api.post("/jobs/{job_id}/cancel", tags=["jobs"])
    def jobs_cancel(job_id: JobId, who: Operator) -> JobOut:
        """Cancel a job (its running copies are killed)."""
        try:
            j = get_job(who, job_id)
        except NotFound:
            store.audit_refusal(who, "job.cancel", job_id, "not found")
            raise
        jobs = backend(Feature.SUBMIT, "cancel a job")
        jobs.cancel(j.id)
        audited(who, "job.cancel", j.id, {"state_before": j.state.value})
        return job_out(jobs.job(j.id))

    @api.get("/jobs/{job_id}/logs", tags=["jobs"])
    def jobs_logs(
        job_id: JobId, who: Viewer, tail: Annotated[int, Query(ge=0, le=100000)] = 0
    ) -> LogsOut:
        """Output of the job's newest copy (what its node's agent last sent)."""
        j = get_job(who, job_id)
        text = backend(Feature.JOB_LOGS, "job logs").logs(j.id) or ""
        if tail:
            text = "".join(text.splitlines(keepends=True)[-tail:])
        return LogsOut(job=j.id, text=text)
