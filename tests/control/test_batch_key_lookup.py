"""The duplicate-batch lookup of every group commit searches the key index key by key
(`gpufleet.control.ingest.writes.known_keys_query`): on SQLite a row-value ``IN`` was planned
as a scan of the whole key index, 7 days of keys, on every commit. The plan is read from the
database itself (``EXPLAIN QUERY PLAN``), and the lookup answers exactly the stored keys among
those asked, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert

from gpufleet.control.db.engine import database_url, make_engine, migrate
from gpufleet.control.db.models import IngestedBatch
from gpufleet.control.ingest.writes import known_keys_query


def _engine(db_config: dict[str, Any]) -> Engine:
    eng = make_engine(database_url(db_config.get("data_dir"), db_config.get("db_url")))
    migrate(eng)
    return eng


def _store_keys(eng: Engine, keys: list[tuple[str, str, int]]) -> None:
    rows = [
        {"node": n, "agent_id": a, "seq": q, "received_s": 0.0, "sent_at_s": 0.0}
        for n, a, q in keys
    ]
    with eng.begin() as c:
        c.execute(insert(IngestedBatch), rows)


def test_the_lookup_answers_the_stored_keys_among_those_asked(db_config: dict[str, Any]) -> None:
    eng = _engine(db_config)
    try:
        stored = [(f"n{i}", f"a{i}", s) for i in range(20) for s in range(1, 4)]
        _store_keys(eng, stored)
        asked = [("n1", "a1", 2), ("n1", "a1", 9), ("n1", "a2", 2), ("n7", "a7", 3), ("x", "y", 1)]
        sqlite = eng.dialect.name == "sqlite"
        with eng.connect() as c:
            got = {tuple(r) for r in c.execute(known_keys_query(asked, sqlite=sqlite))}
        assert got == {("n1", "a1", 2), ("n7", "a7", 3)}
    finally:
        eng.dispose()


def test_sqlite_searches_the_key_index_instead_of_scanning_it(tmp_path: Path) -> None:
    eng = _engine({"data_dir": tmp_path})
    try:
        # a few days of a small fleet's keys, with the statistics a long-lived database has
        _store_keys(eng, [(f"n{i}", f"a{i}", s) for i in range(100) for s in range(200)])
        keys = [(f"n{i}", f"a{i}", 1) for i in range(50)]
        q = known_keys_query(keys, sqlite=True)
        sql = str(q.compile(eng, compile_kwargs={"literal_binds": True}))
        with eng.connect() as c:
            c.exec_driver_sql("ANALYZE")
            plan = [str(row[-1]) for row in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
        assert not any(step.startswith("SCAN ingested_batches") for step in plan), plan
        assert any("SEARCH ingested_batches" in step for step in plan), plan
    finally:
        eng.dispose()
