"""Periodic writes of the control plane: per-minute telemetry rollups (merged with a rollup of
the same minute already stored, for late batches) and retention of rollups, batch keys (the
idempotency window) and events."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Delete, delete, insert, select

from gpufleet.control.db.models import EventRow, IngestedBatch, Rollup
from gpufleet.control.state.rings import merge_stats

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control")


MAX_MINUTE_S = 2**53  # a rollup's minute must fit the signed 64-bit column (and a float exactly)
Item = tuple[str, int, int, int, dict[str, list[float]]]


def storable(item: Item) -> bool:
    """Whether a closed minute can be written: its minute in range, its numbers finite. Ingest
    drops samples outside the time window and readings outside their range, so this only
    guards the flush (every node's rollups in one transaction) against one bad value."""
    _node, _gpu, minute, n, stats = item
    if not -MAX_MINUTE_S <= minute <= MAX_MINUTE_S or not 0 <= n <= MAX_MINUTE_S:
        return False
    return all(math.isfinite(v) for vals in stats.values() for v in vals)


def flush_rollups(store: ControlStore, *, everything: bool = False) -> int:
    """Persist closed minutes (all of them when ``everything``, at shutdown); a minute that
    cannot be stored (`storable`) is logged and left out, never the flush of the others."""
    taken = store.telemetry.take_closed_minutes(store.clock(), all_minutes=everything)
    items = [it for it in taken if storable(it)]
    if len(items) < len(taken):
        bad = sorted({(it[0], it[1]) for it in taken if not storable(it)})
        log.warning(
            "left out %d rollups beyond range: (node, gpu) %s", len(taken) - len(items), bad
        )
    if not items:
        return 0
    with store.sessions.begin() as s:
        minutes = sorted({m for _, _, m, _, _ in items})
        existing = {
            (r.node, r.gpu_index, r.minute_s): r
            for r in s.scalars(select(Rollup).where(Rollup.minute_s.in_(minutes)))
        }
        new_rows = []
        for node, gpu, minute, n, stats in items:
            old = existing.get((node, gpu, minute))
            if old is not None:
                old.stats = merge_stats(old.stats, stats)
                old.samples += n
            else:
                new_rows.append(
                    {
                        "node": node,
                        "gpu_index": gpu,
                        "minute_s": minute,
                        "samples": n,
                        "stats": stats,
                    }
                )
        if new_rows:
            s.execute(insert(Rollup), new_rows)
    return len(items)


def retention_steps(
    store: ControlStore, *, rollups_s: float, batches_s: float, events_s: float
) -> list[Callable[[], None]]:
    """Deletes of what is older than its retention (rollups, batch keys, events), one
    transaction per table (the writer runs them as separate commands)."""
    now = store.clock()
    stmts = [
        delete(Rollup).where(Rollup.minute_s < now - rollups_s),
        delete(IngestedBatch).where(IngestedBatch.received_s < now - batches_s),
        delete(EventRow).where(EventRow.at_s < now - events_s),
    ]

    def step(stmt: Delete) -> Callable[[], None]:
        def run() -> None:
            with store.sessions.begin() as s:
                s.execute(stmt)

        return run

    return [step(st) for st in stmts]
