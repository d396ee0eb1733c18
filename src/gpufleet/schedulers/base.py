"""The `SchedulerBackend` protocol, job records, and the registry of backends by name.

Each backend states what it cannot do and why (``capabilities()``), after SkyPilot's
``clouds/cloud.py``, so callers never discover a missing feature by a failure at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from gpufleet.wire.jobs import JobSpec as JobSpec  # the spec as it travels on the wire


class JobState(StrEnum):
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
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    submitted_at_s: float | None = None
    started_at_s: float | None = None
    ended_at_s: float | None = None


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
class Capability:
    """One feature of the protocol and whether this backend has it (and why not)."""

    name: str
    supported: bool
    why: str = ""


@runtime_checkable
class SchedulerBackend(Protocol):
    """What gpufleet asks of any scheduler."""

    name: str

    def capabilities(self) -> list[Capability]: ...

    def submit(self, spec: JobSpec) -> str: ...

    def cancel(self, job_id: str) -> None: ...

    def list_jobs(self) -> list[JobStatus]: ...

    def node_states(self) -> list[SchedNodeState]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def requeue(self, job_id: str) -> None: ...


SchedulerFactory = Callable[..., SchedulerBackend]
SCHEDULERS: dict[str, SchedulerFactory] = {}


def register_scheduler(name: str) -> Callable[[SchedulerFactory], SchedulerFactory]:
    """Class decorator: make a scheduler backend constructible by name."""

    def deco(factory: SchedulerFactory) -> SchedulerFactory:
        SCHEDULERS[name] = factory
        return factory

    return deco
