"""The one scheduler protocol (`SchedulerBackend`), its capabilities, and job records.

Every scheduler gpufleet drives (``embedded``, ``slurm``, ``kubernetes``, or ``none``) is one
object implementing `SchedulerBackend`; the control plane gets it at construction and calls it
for node lifecycle events (drain, resume, lost, is_idle), for the jobs API, and for the agents'
job exchange. A backend states once what it can and cannot do, with the reason
(``capabilities()``, after SkyPilot's ``clouds/cloud.py``), so callers ask it instead of probing
with ``getattr`` or discovering a missing feature by a failure at run time. Backends are chosen
by name in `gpufleet.schedulers.registry`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from gpufleet.wire import Batch, WireCommand

from gpufleet.wire.jobs import JobSpec as JobSpec  # the spec as it travels on the wire


class JobState(StrEnum):
    """Where a job is in its life (the same words for every backend)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REQUEUED = "requeued"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    """A job as its backend sees it now."""

    id: str
    spec: JobSpec
    state: JobState
    nodes: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    restarts: int = 0  # restarts after its own non-zero exits (``max_restarts``)
    exit_code: int | None = None
    reason: str = ""
    submitted_at_s: float | None = None
    started_at_s: float | None = None
    ended_at_s: float | None = None
    requeues: int = 0  # infrastructure requeues: node lost, fail finding, fencing


@dataclass(frozen=True)
class SchedNodeState:
    """A node as the scheduler sees it."""

    name: str
    state: str  # backend's own word: idle, alloc, mixed, drain, down, ...
    reason: str = ""
    gpus_total: int = 0
    gpus_allocated: int = 0
    schedulable: bool = True


@dataclass(frozen=True)
class Evacuation:
    """What ``evacuate`` did to the jobs running on a node: requeued after the checkpoint
    signal (they had ``grace_s`` to save their state), or killed without it (the signal could
    not be delivered: a node cut off, a backend that cannot signal)."""

    signalled: int = 0
    killed: int = 0
    jobs: tuple[str, ...] = ()
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "signalled": self.signalled,
            "killed": self.killed,
            "jobs": list(self.jobs),
            "note": self.note,
        }


@dataclass(frozen=True)
class JobAttempt:
    """One placement of a job: where, when, how it ended."""

    generation: int
    nodes: tuple[str, ...]
    started_at_s: float | None
    ended_at_s: float | None
    outcome: str


class Feature(StrEnum):
    """Optional features of the protocol; ``capabilities()`` answers each with a reason."""

    SUBMIT = "submit"  # submit, cancel: the backend runs jobs gpufleet hands it
    LIST_JOBS = "list_jobs"  # list_jobs, job: what runs (read-only is fine)
    REQUEUE = "requeue"  # move a running job elsewhere (lost node, fail drain, by request)
    JOB_ATTEMPTS = "job_attempts"  # where each copy of a job ran
    JOB_LOGS = "job_logs"  # the output of a job's newest copy
    AGENT_JOBS = "agent_jobs"  # jobs run by gpufleet agents: commands ride on their acks
    DRAIN = "drain"  # drain, resume, lost: node lifecycle reaches the scheduler
    EVACUATE = "evacuate"  # checkpoint-signal and requeue a node's jobs (a drain's deadline)
    REPORTS_IDLE = "reports_idle"  # is_idle knows whether work still runs on a node
    NODE_STATES = "node_states"  # the scheduler's own view of its nodes
    MULTI_NODE = "multi_node"  # a job over several nodes
    CONTAINER_IMAGES = "container_images"  # JobSpec.image
    MIG = "mig"  # JobSpec.mig_profile
    MIN_GPU_MEMORY = "min_gpu_memory"  # JobSpec.min_gpu_memory_bytes
    PRIORITY = "priority"  # JobSpec.priority orders the queue
    MAX_RESTARTS = "max_restarts"  # JobSpec.max_restarts enforced by the backend


@dataclass(frozen=True)
class Capability:
    """One feature and whether this backend has it (and why, or why not)."""

    feature: Feature
    supported: bool
    why: str = ""

    @property
    def name(self) -> str:
        return self.feature.value


class UnsupportedFeature(UsageError):
    """A backend was asked for a feature it said it does not have (the API answers 501)."""


class Capabilities:
    """A backend's answer for every `Feature` (a feature it does not list is unsupported)."""

    def __init__(self, backend: str, items: list[Capability]) -> None:
        self.backend = backend
        self.items = {c.feature: c for c in items}

    def __iter__(self) -> Iterator[Capability]:
        for f in Feature:
            yield self.items.get(f, Capability(f, False, "not offered by this backend"))

    def supports(self, feature: Feature) -> bool:
        c = self.items.get(feature)
        return c is not None and c.supported

    def why(self, feature: Feature) -> str:
        c = self.items.get(feature)
        return c.why if c is not None and c.why else "not offered by this backend"

    def require(self, feature: Feature, doing: str) -> None:
        """Raise `UnsupportedFeature` (naming the backend and its reason) unless supported."""
        if not self.supports(feature):
            raise UnsupportedFeature(
                f"{doing}: the {self.backend} scheduler does not support {feature.value}",
                hint=self.why(feature),
            )

    def check_spec(self, spec: JobSpec) -> None:
        """Refuse a job asking for a feature this backend lacks, naming the field."""
        self.require(Feature.SUBMIT, f"job {spec.name!r}")
        asks = (
            (Feature.CONTAINER_IMAGES, "image", spec.image),
            (Feature.MIG, "mig_profile", spec.mig_profile),
            (Feature.MIN_GPU_MEMORY, "min_gpu_memory_bytes", spec.min_gpu_memory_bytes),
            (Feature.MULTI_NODE, "nodes", spec.nodes > 1),
        )
        for feature, field_name, asked in asks:
            if asked:
                self.require(feature, f"job {spec.name!r}: {field_name}")


@dataclass(frozen=True)
class NodeFacts:
    """What the control plane knows of a node that a scheduler needs when it joins."""

    name: str
    usable: bool  # in service, not cordoned, no active fail finding (so no lost GPU)
    why: str = ""  # why not usable
    rack: str | None = None
    tenant: str | None = None  # None: shared by every tenant


@dataclass(frozen=True)
class SchedulerContext:
    """What the control plane hands its scheduler at ``start``: the database it owns (the
    embedded scheduler's ``sched_`` tables come with its migrations), its clock, and a view of
    its nodes."""

    engine: Engine
    clock: Callable[[], float]
    node_facts: Callable[[str], NodeFacts | None]
    # hands commands for a node's agent to the control plane as soon as the scheduler has
    # them (they ride on that node's next Ack), instead of after the node's next report
    deliver: Callable[[str, list[WireCommand]], None] | None = None
    # the controller's private data directory (0700): where a scheduler keeps a key to seal
    # what it stores (the embedded scheduler's job specs); None: no directory (a database URL)
    secrets_dir: Path | None = None
    # with several controller replicas (issue 18): does this one lead now, and the guard of
    # a leader's transactions (its fencing token, `gpufleet.control.ha.leader`); a scheduler with
    # periodic work of its own (the embedded one's placement) does it only while leading
    leading: Callable[[], bool] = lambda: True
    fenced: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
    # how a failure of the scheduler's periodic work is logged (``what`` failed with the
    # exception): the control plane logs the database away or a lease moved on in one line,
    # anything else with its traceback
    failed: Callable[[str, Exception], None] | None = None


@runtime_checkable
class SchedulerBackend(Protocol):
    """What gpufleet asks of any scheduler. Lifecycle calls come from the control plane's
    scheduler thread (never the ingest path or the event loop) after the transition committed;
    an optional feature a backend lacks answers `UnsupportedFeature`, and ``capabilities()``
    says so beforehand."""

    name: str

    def capabilities(self) -> Capabilities: ...

    def start(self, context: SchedulerContext) -> None:
        """Begin background work (a tick thread); called once by the control plane."""
        ...

    def stop(self) -> None: ...

    # node lifecycle ---------------------------------------------------------------------
    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        """No new work on ``node``; with ``fail`` (a fail finding, repair) move its jobs now."""
        ...

    def resume(self, node: str) -> None: ...

    def evacuate(self, node: str, reason: str, *, signal: str, grace_s: float) -> Evacuation:
        """A drain's deadline passed: every job still running on ``node`` gets ``signal``
        (its checkpoint signal) and ``grace_s`` seconds to exit, then is killed if needed and
        requeued as an infrastructure requeue (never counted against its own restarts).
        Returns at once; the node is idle once the copies are gone (``is_idle``)."""
        ...

    def node_lost(self, node: str) -> None:
        """``node`` stopped reporting: requeue what ran there."""
        ...

    def is_idle(self, node: str) -> bool:
        """True when nothing runs on ``node`` any more (draining -> drained)."""
        ...

    def node_states(self) -> list[SchedNodeState]: ...

    # jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str: ...

    def cancel(self, job_id: str) -> None: ...

    def requeue(self, job_id: str) -> None: ...

    def list_jobs(self) -> list[JobStatus]: ...

    def job(self, job_id: str) -> JobStatus:
        """One job (`UsageError` when unknown)."""
        ...

    def attempts(self, job_id: str) -> list[JobAttempt]: ...

    def logs(self, job_id: str) -> str | None: ...

    # agents -----------------------------------------------------------------------------
    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        """Take an agent batch's jobs report; the commands for its node (agent_jobs)."""
        ...


class NoScheduler:
    """``--scheduler none``: drains complete at once, nothing to requeue, no jobs API."""

    name = "none"
    WHY = "this controller runs no scheduler (--scheduler none)"

    def __init__(self) -> None:
        self.calls: deque[tuple[str, str]] = deque(maxlen=1000)  # the newest lifecycle calls

    def capabilities(self) -> Capabilities:
        return Capabilities(
            self.name,
            [
                Capability(Feature.DRAIN, True, "recorded only; drains complete at once"),
                Capability(Feature.EVACUATE, True, "nothing runs: nothing to requeue"),
            ]
            + [
                Capability(f, False, self.WHY)
                for f in Feature
                if f not in (Feature.DRAIN, Feature.EVACUATE)
            ],
        )

    def start(self, context: SchedulerContext) -> None:
        return None

    def stop(self) -> None:
        return None

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        self.calls.append(("drain", node))

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))

    def evacuate(self, node: str, reason: str, *, signal: str, grace_s: float) -> Evacuation:
        self.calls.append(("evacuate", node))
        return Evacuation(note="no scheduler: nothing runs")

    def node_lost(self, node: str) -> None:
        self.calls.append(("lost", node))

    def is_idle(self, node: str) -> bool:
        return True

    def node_states(self) -> list[SchedNodeState]:
        return []

    def _refuse(self, feature: Feature) -> UnsupportedFeature:
        return UnsupportedFeature(f"{feature.value}: {self.WHY}")

    def submit(self, spec: JobSpec) -> str:
        raise self._refuse(Feature.SUBMIT)

    def cancel(self, job_id: str) -> None:
        raise self._refuse(Feature.SUBMIT)

    def requeue(self, job_id: str) -> None:
        raise self._refuse(Feature.REQUEUE)

    def list_jobs(self) -> list[JobStatus]:
        raise self._refuse(Feature.LIST_JOBS)

    def job(self, job_id: str) -> JobStatus:
        raise self._refuse(Feature.LIST_JOBS)

    def attempts(self, job_id: str) -> list[JobAttempt]:
        return []

    def logs(self, job_id: str) -> str | None:
        return None

    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        return []
