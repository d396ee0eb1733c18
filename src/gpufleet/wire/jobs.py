"""Jobs on the wire: the job spec (what a user asks to run, as the CLI submits it, as the
scheduler stores it and as the control plane hands it to an agent), the agent's jobs report and
the control plane's start/kill commands.

`JobSpec` is a pydantic dataclass (frozen, positional ``name``) so that schedulers use it as a
plain value; `JOB_SPEC` is its one serialiser (``dump_python``/``dump_json``/``validate_*``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass

from gpufleet.wire.limits import WIRE_CONFIG, GpuIndex

JOB_ID_PATTERN = r"^[A-Za-z0-9_.\-]+$"
MAX_JOB_ID = 64
# the agent builds paths from it (job-<id>/...): no separators, ever
JobId = Annotated[str, Field(min_length=1, max_length=MAX_JOB_ID, pattern=JOB_ID_PATTERN)]
JobName = Annotated[str, Field(min_length=1, max_length=200)]
Tenant = Annotated[str, Field(min_length=1, max_length=100)]
EnvVars = dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=8192)]]

_SPEC_CONFIG = ConfigDict(extra="forbid")


@dataclass(frozen=True, config=_SPEC_CONFIG)
class JobRequest:
    """The fields of a job every submission states (``gpus`` per node, as Slurm's
    ``--gres=gpu:N`` with ``--nodes``); `JobSpec` adds the tenant it runs for."""

    name: JobName
    command: tuple[Annotated[str, Field(max_length=4096)], ...] = ()
    image: Annotated[str | None, Field(max_length=500)] = None
    # 0 only for a job seen in a scheduler that asks for none (a CPU job in Slurm); submissions
    # (`JobSubmit`, the CLI) need at least one
    gpus: Annotated[int, Field(ge=0, le=1024)] = 1
    gpu_model: Annotated[str | None, Field(max_length=64)] = None
    min_gpu_memory_bytes: Annotated[int | None, Field(ge=0)] = None
    mig_profile: Annotated[str | None, Field(max_length=64)] = None
    nodes: Annotated[int, Field(ge=1, le=4096)] = 1
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    # restarts after the job's own non-zero exits; infrastructure requeues (node lost, fail
    # finding, fencing) never count here: they have their own cap, ``max_requeues``
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = 3
    max_requeues: Annotated[int, Field(ge=0, le=1000)] = 10
    checkpoint_dir: Annotated[str | None, Field(max_length=4096)] = None
    env: EnvVars = Field(default_factory=dict)
    duration_s: Annotated[float | None, Field(gt=0, le=10**7)] = None  # simulated: work length


@dataclass(frozen=True, config=_SPEC_CONFIG)
class JobSpec(JobRequest):
    """What a user asks to run, for one tenant."""

    tenant: Tenant = "default"


@dataclass(frozen=True, config=_SPEC_CONFIG)
class JobSubmit(JobRequest):
    """``POST /api/v1/jobs``: a job to submit; without ``tenant``, the token's tenant (else
    ``default``)."""

    tenant: Tenant | None = None
    gpus: Annotated[int, Field(ge=1, le=1024)] = 1

    def to_spec(self, tenant: str) -> JobSpec:
        """The spec to schedule, for ``tenant``."""
        given = {f.name: getattr(self, f.name) for f in fields(JobRequest)}
        return JobSpec(**given, tenant=tenant)


JOB_SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


class WireSlot(BaseModel):
    """One GPU a job may be placed on (catalog model key and memory)."""

    model_config = WIRE_CONFIG

    index: GpuIndex
    model: str = Field(max_length=64)
    memory_bytes: int = Field(ge=0)


class WireJobCopy(BaseModel):
    """What the agent knows of one copy of a job (running, or how it ended)."""

    model_config = WIRE_CONFIG

    job_id: JobId
    generation: int = Field(ge=0)
    running: bool
    exit_code: int | None = None
    reason: str = Field("", max_length=500)
    node_fault: bool = False  # it died because of the node (a GPU fell off the bus, ...)
    # stopped by fencing (its agent's lease ran out, the agent died) or killed by the agent:
    # requeued, never counted as the job's own failure
    fenced: bool = False
    log_tail: str | None = Field(None, max_length=8192)  # end of its output, when changed


class WireJobs(BaseModel):
    """An agent's jobs report: its schedulable GPUs, its lease, and its copies of jobs."""

    model_config = WIRE_CONFIG

    lease_s: float = Field(gt=0, le=86400)  # cut off this long, the agent kills its own jobs
    slots: list[WireSlot] = Field(default_factory=list)
    copies: list[WireJobCopy] = Field(default_factory=list)


# a checkpoint signal by name, as kill(1) and Slurm's ``--signal`` write it (``USR1``, ``SIGUSR1``)
SignalName = Annotated[str, Field(pattern=r"^(SIG)?[A-Z][A-Z0-9]{1,7}$", max_length=10)]


class WireCommand(BaseModel):
    """The control plane asks the agent to start (with its ``spec``) or kill one copy of a job;
    ``generation`` is the fence token of that copy. A kill with ``signal`` is a checkpoint
    stop: the job's process gets ``signal`` first and ``grace_s`` seconds to exit before it
    is killed (Slurm's ``--signal=B:SIG@TIME``)."""

    model_config = WIRE_CONFIG

    op: Literal["start", "kill"]
    job_id: JobId
    generation: int = Field(ge=0)
    gpus: list[GpuIndex] = Field(default_factory=list)
    env: EnvVars = Field(default_factory=dict)
    spec: JobSpec | None = None  # start only
    signal: SignalName | None = None  # kill only: the checkpoint signal
    grace_s: float = Field(0.0, ge=0, le=86400)  # kill only: time to exit after ``signal``
