"""Persisting the energy ledger (`gpufleet.control.state.energy_ledger`), on the writer with the
rollups (every 15 s): first the power samples the telemetry store received since the last
flush are integrated in bulk and the queued counter readings accounted; then the minutes are
added to the stored ones (an upsert that adds each part) and the counter readings they account
for are replaced, in one transaction, so that after a restart the next counter reading's
window starts exactly where the stored energy ends."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from gpufleet.control.db.models import EnergyCounter, EnergyMinute, JobProgress
from gpufleet.control.state.energy_ledger import COLUMNS, EnergyLedger
from gpufleet.control.state.lifecycle import NodeState

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control.energy")


def _upsert(s: Session, model: Any, rows: list[dict[str, Any]], add: bool) -> None:
    """Insert ``rows``, or on a key already stored add each part (``add``) or replace; one
    statement run for all rows (executemany)."""
    dialect = s.get_bind().dialect.name
    ins: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = model.__table__
    stmt = ins(table)
    keys = [c.name for c in table.primary_key.columns]
    if add:
        sets = {c: table.c[c] + stmt.excluded[c] for c in COLUMNS}
    else:
        sets = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
    s.execute(stmt.on_conflict_do_update(index_elements=keys, set_=sets), rows)


def flush_energy(store: ControlStore) -> int:
    """Persist what the ledger accumulated (writer thread); returns the minutes written. On
    failure the minutes go back into the ledger for the next flush."""
    ledger: EnergyLedger = store.energy
    in_service = NodeState.IN_SERVICE.value
    nodes = {
        name: (nc.state == in_service, {i: (nc.tenant, g.model) for i, g in nc.gpus.items()})
        for name, nc in store.nodes.items()
    }
    if store.engine.dialect.name != "sqlite":  # replicas share the counters (docs/energy.md)
        _merge_other_replicas(store, ledger.queued_nodes())
    ledger.integrate(store.telemetry, nodes, store.policy.idle_util_pct)
    taken = ledger.take()
    if not taken.minutes and not taken.counters:
        return 0
    rows = []
    for (node, gpu, minute), vals in taken.minutes.items():
        if not all(math.isfinite(v) for v in vals):
            log.warning("energy of %s GPU %d at %d not finite; left out", node, gpu, minute)
            continue
        tenant, model = taken.labels.get((node, gpu), (None, None))
        row: dict[str, Any] = {
            "node": node,
            "gpu_index": gpu,
            "minute_s": minute,
            "tenant": tenant,
            "model": model,
        }
        row.update(zip(COLUMNS, vals, strict=True))
        rows.append(row)
    counters = [
        {"node": n, "gpu_index": g, "t_s": t, "counter_mj": mj}
        for (n, g), (t, mj) in taken.counters.items()
    ]
    try:
        with store.sessions.begin() as s:
            if rows:
                _upsert(s, EnergyMinute, rows, add=True)
            if counters:
                _upsert(s, EnergyCounter, counters, add=False)
    except Exception:
        ledger.give_back(taken)
        raise
    return len(rows)


def _merge_other_replicas(store: ControlStore, names: set[str]) -> None:
    """Before accounting a batch of readings: the newer counter readings another replica
    stored for the same GPUs (an agent that failed over between replicas)."""
    if not names:
        return
    cols = (
        EnergyCounter.node,
        EnergyCounter.gpu_index,
        EnergyCounter.t_s,
        EnergyCounter.counter_mj,
    )
    with store.sessions() as s:
        got = s.execute(select(*cols).where(EnergyCounter.node.in_(sorted(names)))).all()
    store.energy.merge_newer((n, g, t, mj) for n, g, t, mj in got)


def load_counters(store: ControlStore) -> None:
    """The persisted counter readings into the ledger (at start)."""
    with store.sessions() as s:
        got = s.execute(
            select(
                EnergyCounter.node,
                EnergyCounter.gpu_index,
                EnergyCounter.t_s,
                EnergyCounter.counter_mj,
            )
        )
        store.energy.restore((n, g, t, mj) for n, g, t, mj in got)


def retain(store: ControlStore, before_s: float) -> None:
    """Delete energy minutes (and jobs' progress readings) older than ``before_s`` (writer
    thread)."""
    with store.sessions.begin() as s:
        s.execute(delete(EnergyMinute).where(EnergyMinute.minute_s < before_s))
        s.execute(delete(JobProgress).where(JobProgress.t_s < before_s))
