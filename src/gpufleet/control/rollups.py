"""Periodic writes of the control plane: per-minute telemetry rollups (merged with a rollup of
the same minute already stored, for late batches) and retention of rollups, batch keys (the
idempotency window) and events."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Delete, delete, insert, select

from gpufleet.control.models import EventRow, IngestedBatch, Rollup
from gpufleet.control.telemetry_store import merge_stats

if TYPE_CHECKING:
    from gpufleet.control.store import ControlStore


def flush_rollups(store: ControlStore, *, everything: bool = False) -> int:
    """Persist closed minutes (all of them when ``everything``, at shutdown)."""
    items = store.telemetry.take_closed_minutes(store.clock(), all_minutes=everything)
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
