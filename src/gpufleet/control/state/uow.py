"""The unit of work: one transaction on the writer thread, the way every write outside the
kernel is made. It holds the session, the kernel's transitions bound to it, and the scheduler
calls its transitions queue; when the block ends the transaction commits, those calls are
handed to the store (made after the next snapshot is out) and the snapshot's generation moves
on. An exception rolls back and hands nothing over::

    with store.unit_of_work() as uow:
        uow.move(nc, NodeState.DRAINING, actor=who.actor, reason=reason)
        uow.audit(who, "node.drain", nc.name)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from gpufleet.control.state import lifecycle as lc
from gpufleet.control.state import transitions as tr
from gpufleet.control.state.lifecycle import NodeState

if TYPE_CHECKING:
    from gpufleet.control.state.auth import Principal
    from gpufleet.control.state.cache import NodeCache
    from gpufleet.control.state.store import ControlStore


@dataclass
class UnitOfWork:
    """One transaction: ``s`` its session, ``after`` the scheduler calls for after the commit."""

    store: ControlStore
    s: Session
    after: lc.PostCommit = field(default_factory=list)

    def move(self, nc: NodeCache, to: NodeState, *, actor: str, reason: str) -> None:
        """Move a node (`gpufleet.control.state.transitions.move`)."""
        tr.move(self.store, self.s, nc, to, actor=actor, reason=reason, after=self.after)

    def maybe_in_service(self, nc: NodeCache, actor: str) -> None:
        """A validating node in service where the policy lets it."""
        tr.maybe_in_service(self.store, self.s, nc, actor, self.after)

    def update_breaker(self) -> None:
        """The circuit breaker against the nodes out now (an event when it changes)."""
        tr.update_breaker(self.store, self.s)

    def later(self, call: Callable[[], None]) -> None:
        """A scheduler call for after the commit (e.g. ``store.hook.drain``)."""
        self.after.append(call)

    def audit(
        self,
        who: Principal,
        action: str,
        target: str = "",
        outcome: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """An audit row in this transaction."""
        self.store.audit(self.s, who, action, target, outcome, detail)


@contextmanager
def unit_of_work(store: ControlStore, *, bump: bool = True) -> Iterator[UnitOfWork]:
    """A `UnitOfWork` on ``store`` (on the writer thread); ``bump``: the snapshot's generation
    moves on after the commit (False for writes no reader of the snapshot sees)."""
    with store.sessions.begin() as s:
        uow = UnitOfWork(store, s)
        yield uow
    store.run_after(uow.after)
    if bump:
        store.bump()
