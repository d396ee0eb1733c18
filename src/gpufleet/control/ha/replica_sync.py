"""Keeping a replica's node cache in line with what other replicas write (issue 18).

Each controller replica answers reads from its own cache of nodes, GPUs and active findings
(`gpufleet.control.state.cache`); with several replicas on one PostgreSQL, the others write too (the
leader's transitions, ingest of nodes that push elsewhere, operators' actions). Every
``refresh_s`` each replica (a writer command) asks the database for a fingerprint of what
changes the cache: the newest audit, transition and finding ids, the newest clearing of a
finding, the count and severity sum of active findings, and the node count (every transition,
action, attribute change and finding change moves one of those; the event log, which every
agent event grows, does not take part). When it moved, the whole cache is read again
(`ControlStore.load`); otherwise only the nodes' ``last_seen_s`` are merged (the newest
wins), which is what the leader's lost detection needs of nodes that push to another
replica. After a whole read, ``reloaded`` (given by the composition root: the maintenance
campaigns' update orders) reads what it keeps of the database again too. A write made from a
stale cache is refused anyway (`gpufleet.control.state.transitions.move` checks the node's row
under a row lock), so this bounds how stale a read is, not what is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from gpufleet.control.db.models import AuditEntry, FindingRow, Node, Transition

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

Fingerprint = tuple[int | None, ...]


def fingerprint(store: ControlStore) -> Fingerprint:
    """What moves whenever another replica changed something this cache holds."""
    active = FindingRow.active.is_(True)
    with store.sessions() as s:
        row = s.execute(
            select(
                select(func.max(AuditEntry.id)).scalar_subquery(),
                select(func.max(Transition.id)).scalar_subquery(),
                select(func.max(FindingRow.id)).scalar_subquery(),
                select(func.max(FindingRow.cleared_s)).scalar_subquery(),
                select(func.count(FindingRow.id)).where(active).scalar_subquery(),
                select(func.sum(FindingRow.severity)).where(active).scalar_subquery(),
                select(func.count(Node.id)).scalar_subquery(),
            )
        ).one()
    return tuple(row)


def refresh(
    store: ControlStore, last: Fingerprint | None, reloaded: Callable[[], None] = lambda: None
) -> Fingerprint:
    """One refresh (on the writer); returns the fingerprint to compare with next time."""
    seen = {name: nc.last_seen_s for name, nc in store.nodes.items()}
    now_fp = fingerprint(store)
    if now_fp != last:
        store.load()
        reloaded()
    else:
        with store.sessions() as s:
            for name, at in s.execute(select(Node.name, Node.last_seen_s)):
                nc = store.nodes.get(name)
                if nc is not None and at is not None and at > (nc.last_seen_s or 0.0):
                    nc.last_seen_s = at
                    store.dirty(name)
    for name, at in seen.items():  # what this replica heard and has not persisted yet
        nc = store.nodes.get(name)
        if nc is not None and at is not None and at > (nc.last_seen_s or 0.0):
            nc.last_seen_s = at
            store.dirty(name)
    store.bump()
    return now_fp
