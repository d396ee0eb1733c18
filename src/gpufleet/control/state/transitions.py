"""The kernel's transitions, each inside a caller's transaction on the writer thread: move a
node to another lifecycle state (checked against the database row and the state machine), put
a validating node in service where the policy lets it, update the circuit breaker and record
its opening or closing, and drain the nodes whose drain the breaker blocked once it closed.

Code outside `gpufleet.control.state` reaches these through a unit of work
(`gpufleet.control.state.uow.UnitOfWork`: ``uow.move(nc, to, actor=..., reason=...)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.control.db.models import EventRow, Node
from gpufleet.control.state import lifecycle as lc
from gpufleet.control.state.lifecycle import NodeState
from gpufleet.control.state.remediation import (
    BLOCKED_REASON,
    allowed_out,
    breaker_severity,
    drain_codes,
)

if TYPE_CHECKING:
    from gpufleet.control.state.cache import NodeCache
    from gpufleet.control.state.store import ControlStore

S = NodeState


class StaleCache(RuntimeError):
    """The cache disagreed with the database (another replica wrote): the transaction rolls
    back and the cache is reloaded."""


def move(
    store: ControlStore,
    s: Session,
    nc: NodeCache,
    to: NodeState,
    *,
    actor: str,
    reason: str,
    after: lc.PostCommit,
) -> None:
    """Move node ``nc`` to ``to``: its row locked and checked against the cache (another
    replica may have moved the node since this cache last read it, `gpufleet.control.ha.
    replica_sync`; then `StaleCache` and nothing is written), the transition recorded, the
    scheduler call queued on ``after``, the breaker updated."""
    row = s.get(Node, nc.id, with_for_update=True, populate_existing=True)
    if row is None or row.state != nc.state:
        raise StaleCache(
            f"node {nc.name}: {row.state if row else 'gone'} in the database, "
            f"{nc.state} in this replica's cache"
        )
    now = store.clock()
    lc.transition(s, row, to, actor=actor, reason=reason, now_s=now, hook=store.hook, after=after)
    nc.state, nc.state_since_s, nc.state_reason = to.value, now, reason
    store.dirty(nc.name)
    if to is S.IN_SERVICE:
        row.cordoned = nc.cordoned = False
    update_breaker(store, s)


def maybe_in_service(
    store: ControlStore, s: Session, nc: NodeCache, actor: str, after: lc.PostCommit
) -> None:
    """A validating node goes in service when the policy does not require a validation and
    neither the agent's health nor a finding fails."""
    if nc.state != S.VALIDATING or store.policy.require_validation:
        return
    if nc.health >= 2 or any(f.severity >= 2 for f in nc.findings.values()):
        return
    move(
        store,
        s,
        nc,
        S.IN_SERVICE,
        actor=actor,
        after=after,
        reason="validation not required by policy and the agent reports no fail finding",
    )


def update_breaker(store: ControlStore, s: Session | None) -> None:
    """The circuit breaker against the nodes out now; an event when it opens, closes, or is
    open and worse than it was told (a warning that turns critical as more nodes go: told
    again, louder). ``s`` None (loading): the state as found, told by no event."""
    out, total = store.out_count()
    policy, breaker = store.policy, store.breaker
    changed = breaker.update(
        out, total, policy.max_out_fraction, store.clock(), policy.min_out_nodes
    )
    if changed is None and not breaker.open:
        return
    allowed = allowed_out(total, policy.max_out_fraction, policy.min_out_nodes)
    severity = breaker_severity(out, total, allowed) if breaker.open else 0
    if s is None:
        store.breaker_told = severity
        return
    if changed is not None or severity > store.breaker_told:
        store.breaker_told = severity
        s.add(
            EventRow(
                at_s=store.clock(),
                kind="circuit_breaker_open" if breaker.open else "circuit_breaker_closed",
                severity=severity,
                message=breaker.message,
                data={
                    "out": out,
                    "total": total,
                    "allowed": allowed,
                    "limit": policy.max_out_fraction,
                    "min_out_nodes": policy.min_out_nodes,
                },
            )
        )


def retry_blocked_drains(store: ControlStore, s: Session, after: lc.PostCommit) -> list[str]:
    """Drain the in-service nodes whose drain the breaker blocked, now that it is closed, as
    long as it stays closed (each drain counts against it). A node an operator put back in
    service after the block (its state is newer than the block's event) is left alone.
    Runs on the writer (``ControlStore.check_nodes``); returns the nodes drained."""
    drained: list[str] = []
    for nc in list(store.nodes.values()):
        if nc.state != S.IN_SERVICE.value or store.policy.dry_run:
            continue
        codes = drain_codes(store.policy, ((k[0], f.severity) for k, f in nc.findings.items()))
        if not codes:
            continue
        update_breaker(store, s)
        if store.breaker.open:
            break
        blocked = s.execute(
            select(EventRow.id)
            .where(EventRow.node == nc.name)
            .where(EventRow.kind == "remediation_blocked")
            .where(EventRow.at_s >= nc.state_since_s)
            .limit(1)
        ).first()
        if blocked is None:
            continue
        reason = f"finding {codes[0]}: drained once the circuit breaker closed ({BLOCKED_REASON})"
        move(store, s, nc, S.DRAINING, actor="remediation", reason=reason, after=after)
        drained.append(nc.name)
    return drained
