"""Periodic writes of the control plane: per-minute telemetry rollups and retention of rollups,
batch keys (the idempotency window) and events.

A minute's rollup is written once the minute has ended by the clock and `CLOSE_GRACE_S` more
have passed (the service flushes every `FLUSH_S`), so a crash loses at most the minute still
open and the few seconds after it, and, of a minute already written, what arrived in the last
flush period. The grace is two default push intervals: the agent's batch that straddles the
minute's end then lands before the write, not as a second write of every GPU's row (at 10,000
nodes x 8 GPUs on SQLite, about 7 s of the writer per minute without the grace, 2.5 s with it).
Samples of a minute that come after it was written (an agent's batch straddling the minute's
end, a spool replayed after an outage, the same minute from another replica or from this
controller before a restart) are merged into the stored row (counts and sums add, minima and
maxima combine: `merge_stats`). A write that fails puts its minutes back in memory for the next
flush."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Delete, delete, insert, select, update
from sqlalchemy.orm import Session

from gpufleet.control.db.models import EventRow, IngestedBatch, Rollup
from gpufleet.control.state.rings import merge_stats

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control")


FLUSH_S = 2.0  # how often the service writes the minutes that have closed
# seconds after a minute's end before it is written: two of the agent's default 5 s pushes
# (`gpufleet.agent.runner.DEFAULT_PUSH_INTERVAL_S`), so the batch straddling the end is in it
CLOSE_GRACE_S = 10.0
MAX_MINUTE_S = 2**53  # a rollup's minute must fit the signed 64-bit column (and a float exactly)
STEP_ROWS = 2000  # GPU rows a flush step writes, one transaction (~0.1 s of the writer)
MAX_STEPS = 500  # steps of one flush: a million GPUs' minute
KEY_CHUNK = 300  # (node, gpu, minute) keys per lookup: under SQLite's 999 bound parameters
Item = tuple[str, int, int, int, dict[str, list[float]]]
Step = tuple[int, bool]  # rows written, whether closed minutes are left


def storable(item: Item) -> bool:
    """Whether a closed minute can be written: its minute in range, its numbers finite. Ingest
    drops samples outside the time window and readings outside their range, so this only
    guards the flush (every node's rollups in one transaction) against one bad value."""
    _node, _gpu, minute, n, stats = item
    if not -MAX_MINUTE_S <= minute <= MAX_MINUTE_S or not 0 <= n <= MAX_MINUTE_S:
        return False
    return all(math.isfinite(v) for vals in stats.values() for v in vals)


def flush_rollups(
    store: ControlStore, *, everything: bool = False, max_rows: int | None = None
) -> int:
    """Write the minutes that have closed (all of them when ``everything``, at shutdown),
    merged with rows of the same minutes already stored, in one transaction; returns the rows
    written. ``max_rows``: about that many at most (`flush_closed` writes the rest in further
    steps). A minute that cannot be stored (`storable`) is logged and left out, never the flush
    of the others; when the transaction fails, the minutes go back to memory and the error is
    raised."""
    return _flush(store, everything=everything, max_rows=max_rows)[0]


def flush_closed(store: ControlStore, call: Callable[[Callable[[], Step]], Step]) -> int:
    """Write the closed minutes in steps of about `STEP_ROWS` rows, each step one command on
    the writer (``call``: ``store.writer.call``) so ingest commits interleave with a fleet's
    minute; at most `MAX_STEPS` steps (the rest waits for the next flush). Not on the writer
    thread itself."""
    total = 0
    for _ in range(MAX_STEPS):
        n, more = call(lambda: _flush(store, everything=False, max_rows=STEP_ROWS))
        total += n
        if not more:
            break
    return total


def _flush(store: ControlStore, *, everything: bool, max_rows: int | None) -> Step:
    closed, more = store.telemetry.take_closed(
        store.clock() - CLOSE_GRACE_S, all_minutes=everything, max_rows=max_rows
    )
    items: list[Item] = []
    kept = []
    bad: set[tuple[str, int]] = set()
    for cm in closed:
        rows = cm.rows()
        left_out = {it[1] for it in rows if not storable(it)}
        bad.update((cm.node, g) for g in left_out)
        items.extend(it for it in rows if it[1] not in left_out)
        if len(left_out) < len(rows):
            kept.append(cm.without(left_out) if left_out else cm)
    if bad:
        log.warning("left out rollups beyond range: (node, gpu) %s", sorted(bad))
    if not items:
        return 0, more
    try:
        with store.sessions.begin() as s:
            write_rows(s, items)
    except Exception:
        store.telemetry.put_back(kept)
        raise
    return len(items), more


def write_rows(s: Session, items: Sequence[Item]) -> None:
    """Insert the rollup rows of ``items`` (distinct keys, as one take gives); a row of the
    same (node, gpu, minute) already stored gets the item merged into it. The lookup is by
    primary key, so a minute's late samples of a few nodes never read the rest of the fleet's
    rows of that minute."""
    keyed = {(node, gpu, minute): (n, stats) for node, gpu, minute, n, stats in items}
    updates: list[dict[str, Any]] = []
    for minute, nodes, gpus in _lookups(keyed):
        q = select(Rollup.node, Rollup.gpu_index, Rollup.samples, Rollup.stats).where(
            Rollup.minute_s == minute, Rollup.node.in_(nodes), Rollup.gpu_index.in_(gpus)
        )
        for node, gpu, samples, stats in s.execute(q):
            got = keyed.pop((node, gpu, minute), None)
            if got is None:  # a GPU of these nodes with nothing new this time
                continue
            n, new = got
            updates.append(
                {
                    "node": node,
                    "gpu_index": gpu,
                    "minute_s": minute,
                    "samples": samples + n,
                    "stats": merge_stats(stats if isinstance(stats, dict) else {}, new),
                }
            )
    if keyed:
        s.execute(
            insert(Rollup),
            [
                {"node": k[0], "gpu_index": k[1], "minute_s": k[2], "samples": n, "stats": st}
                for k, (n, st) in keyed.items()
            ],
        )
    if updates:
        s.execute(update(Rollup), updates)  # by primary key, executemany


def _lookups(keyed: dict[tuple[str, int, int], Any]) -> list[tuple[int, list[str], list[int]]]:
    """The keys as lookups of (minute, nodes, GPUs), at most `KEY_CHUNK` keys each: equality
    on the minute and IN lists on the node and GPU, which SQLite and PostgreSQL answer from
    the primary key (a row-value IN of whole keys is a scan of the table on SQLite)."""
    out = []
    keys = sorted(keyed, key=lambda k: (k[2], k[0], k[1]))
    for i in range(0, len(keys), KEY_CHUNK):
        part = keys[i : i + KEY_CHUNK]
        for minute in sorted({k[2] for k in part}):
            nodes = sorted({k[0] for k in part if k[2] == minute})
            gpus = sorted({k[1] for k in part if k[2] == minute})
            out.append((minute, nodes, gpus))
    return out


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
