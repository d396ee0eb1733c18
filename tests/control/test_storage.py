"""Storage on SQLite and PostgreSQL: migrations from empty, idempotent ingest, rollups."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from gpufleet.control.db.engine import (
    current_revision,
    head_revision,
    make_engine,
    migrate,
    table_names,
)
from gpufleet.control.db.models import IngestedBatch, Rollup
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.devices.sim import ManualClock
from tests.control.conftest import T0, batch, push

EXPECTED_TABLES = {
    "alembic_version",
    "api_tokens",
    "audit_log",
    "controller_state",
    "energy_counters",  # energy accounting (revision 0007)
    "energy_minutes",
    "events",
    "findings",
    "gpus",
    "ingested_batches",
    "job_progress",  # jobs' reported progress (revision 0011)
    "leader_lease",  # leader election among replicas (revision 0008)
    "maint_campaigns",  # maintenance campaigns (revision 0006)
    "maint_nodes",
    "maint_steps",
    "nodes",
    "notification_outbox",  # notifications until delivered (revision 0012)
    "power_order_nodes",  # fleet power orders (revision 0009)
    "power_orders",
    "racks",
    "rollups",
    "sched_attempts",  # the embedded scheduler's tables (revision 0002)
    "sched_jobs",
    "sched_nodes",
    "sched_quotas",
    "sites",
    "tenants",
    "transitions",
    "validation_results",
}


def test_migrations_from_empty(db_config: dict[str, Any]) -> None:
    from gpufleet.control.db.engine import database_url

    engine = make_engine(database_url(db_config.get("data_dir"), db_config.get("db_url")))
    assert current_revision(engine) is None
    rev = migrate(engine)
    assert rev == head_revision() == "0012"
    assert set(table_names(engine)) == EXPECTED_TABLES
    assert migrate(engine) == rev  # a second run changes nothing
    engine.dispose()


def test_ingest_idempotent_and_rollups(db_config: dict[str, Any]) -> None:
    clock = ManualClock(T0)
    svc = ControlService(ServiceConfig(**db_config), clock=clock)
    svc.ingest.start()
    try:
        first = push(svc, batch("n1", 1, k=3))
        again = push(svc, batch("n1", 1, k=3))
        push(svc, batch("n1", 2, t=T0 + 3, k=3, devices=False))
        assert (first.duplicate, again.duplicate) == (False, True)
        with svc.store.sessions() as s:
            assert s.scalar(select(func.count()).select_from(IngestedBatch)) == 2
        # 2 batches x 2 GPUs x 3 samples = 12 (the replay counted nothing)
        assert svc.store.stats["samples"] == 12
        t, cols = svc.store.telemetry.series("n1", 1, ["gpu_util_pct"])
        assert t == [T0 + i for i in range(6)]
        assert cols["gpu_util_pct"] == [10.0, 11.0, 12.0, 10.0, 11.0, 12.0]
        clock.advance(300)
        assert svc.flush_rollups() > 0
        with svc.store.sessions() as s:
            rows = list(s.scalars(select(Rollup).where(Rollup.node == "n1", Rollup.gpu_index == 1)))
        # T0 = 1_700_000_000 is 20 s into its minute: samples T0..T0+5 share one minute
        assert [r.minute_s for r in rows] == [int(T0 // 60 * 60)]
        count, lo, mean, hi = rows[0].stats["gpu_util_pct"]
        assert (count, lo, mean, hi) == (6, 10.0, 11.0, 12.0)
    finally:
        svc.stop()


def test_migration_0003_keeps_batches_and_keys_them_by_node(db_config: dict[str, Any]) -> None:
    """Upgrading a database with batches keeps them (the table is rebuilt under the new key),
    and afterwards two nodes may use the same (agent_id, seq)."""
    from sqlalchemy import insert

    from gpufleet.control.db.engine import database_url

    engine = make_engine(database_url(db_config.get("data_dir"), db_config.get("db_url")))
    try:
        assert migrate(engine, "0002") == "0002"
        row = {
            "agent_id": "a",
            "seq": 1,
            "node": "n1",
            "received_s": T0,
            "sent_at_s": T0,
            "samples": 0,
            "findings": 0,
            "events": 0,
            "buffered": False,
        }
        with engine.begin() as conn:
            conn.execute(insert(IngestedBatch), [row])
        assert migrate(engine) == head_revision()
        with engine.begin() as conn:
            conn.execute(insert(IngestedBatch), [{**row, "node": "n2"}])
            kept = conn.execute(select(IngestedBatch.node).order_by(IngestedBatch.node)).all()
        assert [k[0] for k in kept] == ["n1", "n2"]
    finally:
        engine.dispose()
