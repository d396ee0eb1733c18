"""The kernel's ports: the protocols through which the control plane's state reaches what lies
outside it (scheduling, the write of agent batches, notifications), each implemented by a wing
and handed in by the composition root (`gpufleet.control.service`). The kernel imports no wing;
a store built without one of these gets the null implementation named beside it.

=====================  ==========================================  =============================
port                   implemented by                              without it
=====================  ==========================================  =============================
`SchedulerHook`        `gpufleet.control.jobs.events.              `NO_SCHEDULER`: drains are
                       SchedulerEvents` (the scheduler backend)    confirmed at once, no jobs
`BatchWriter`          `gpufleet.control.ingest.writes.            the store refuses batches
                       apply_batches`                              (`NoBatchWriter`)
`Notifier`             `gpufleet.control.notify.notifier.          nothing is told
                       SessionNotifier`
=====================  ==========================================  =============================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gpufleet.schedulers.base import Evacuation
from gpufleet.wire import Ack, Batch, WireCommand

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gpufleet.control.db.models import EventRow, ValidationResultRow
    from gpufleet.control.state.cache import IngestItem
    from gpufleet.control.state.store import ControlStore


class SchedulerHook(Protocol):
    """What the node lifecycle asks of scheduling, after the transition committed: drains,
    resumes, losses and a drain's evacuation, whether a drain is confirmed and a node idle, and
    the agents' job reports. Calls run off the writer (the store queues them for after the
    snapshot that holds the transition)."""

    @property
    def reports_idle(self) -> bool:
        """Can `is_idle` tell whether work still runs on a node (else ``min_drain_s``
        decides)?"""
        ...

    @property
    def runs_agent_jobs(self) -> bool:
        """Do agents run this scheduler's jobs (their reports go to `exchange`)?"""
        ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def lost(self, node: str) -> None: ...

    def evacuate(
        self,
        node: str,
        reason: str,
        *,
        signal: str,
        grace_s: float,
        then: Callable[[Evacuation], None],
    ) -> None: ...

    def drain_confirmed(self, node: str) -> bool: ...

    def is_idle(self, node: str) -> bool: ...

    def exchange(self, batch: Batch, now_s: float) -> list[WireCommand]:
        """Take an agent batch's jobs report; the commands for its node."""
        ...


class _NoScheduler:
    """`SchedulerHook` of a store with no scheduler (one-shot CLI commands, unit tests): every
    drain is confirmed at once, every node idle, nothing runs on agents."""

    reports_idle = False
    runs_agent_jobs = False

    def drain(self, node: str, reason: str) -> None:
        return None

    def resume(self, node: str) -> None:
        return None

    def lost(self, node: str) -> None:
        return None

    def evacuate(
        self,
        node: str,
        reason: str,
        *,
        signal: str,
        grace_s: float,
        then: Callable[[Evacuation], None],
    ) -> None:
        then(Evacuation(note="no scheduler: nothing runs"))

    def drain_confirmed(self, node: str) -> bool:
        return True

    def is_idle(self, node: str) -> bool:
        return True

    def exchange(self, batch: Batch, now_s: float) -> list[WireCommand]:
        return []


NO_SCHEDULER: SchedulerHook = _NoScheduler()


class BatchWriter(Protocol):
    """Stores a group of agent batches in one transaction on the writer thread and returns one
    `Ack` per batch, in order (the writer's group commit calls it)."""

    def __call__(self, store: ControlStore, items: list[IngestItem]) -> list[Ack]: ...


class NoBatchWriter(RuntimeError):
    """The store was built without a `BatchWriter` (it takes no agent batches)."""


class RefusedUnchanged(Exception):
    """A writer command refused before it read or wrote anything (a wing's own refusal, e.g.
    leader work on a replica that knows it does not lead): the kernel's cache needs no
    rebuild after it."""


class Notifier(Protocol):
    """Told of every event row and validation result a transaction writes, inside that
    transaction (so a durable outbox can be written in it), and of its end."""

    def enqueue(self, session: Session, row: EventRow | ValidationResultRow) -> None:
        """``row`` was written in ``session``'s transaction (not yet committed)."""
        ...

    def committed(self, session: Session) -> None:
        """``session``'s transaction committed: what it enqueued may go out."""
        ...

    def rolled_back(self, session: Session) -> None:
        """``session``'s transaction rolled back: what it enqueued never happened."""
        ...
