"""The Alembic migrations build exactly the schema the ORM models describe.

Each test runs every migration on an empty database, then asks Alembic's autogenerate to compare
the result with the models' metadata (the control plane's ``Base.metadata`` plus the embedded
scheduler's tables, which migration 0002 creates in the same database). Any difference (a column
added to a model without a migration, a changed type, a missing index) fails the test with the
list of differences.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpufleet.control.db.engine import head_revision, make_engine, migrate
from gpufleet.control.db.models import Base
from gpufleet.errors import ConfigError
from gpufleet.schedulers.embedded.store import metadata as scheduler_metadata


def models() -> sa.MetaData:
    """One MetaData holding the control plane's tables and the embedded scheduler's."""
    combined = sa.MetaData()
    for metadata in (Base.metadata, scheduler_metadata):
        for table in metadata.tables.values():
            table.to_metadata(combined)
    return combined


def _differences(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, models()))


def _check(engine: sa.Engine) -> None:
    assert migrate(engine) == head_revision()
    diff = _differences(engine)
    assert diff == [], "migrations and models differ (add a migration):\n" + "\n".join(
        map(repr, diff)
    )


def test_sqlite_migrations_match_models(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fleet.db'}")
    try:
        _check(engine)
    finally:
        engine.dispose()


def test_postgresql_migrations_match_models(pg_url: str) -> None:
    name = f"mig_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(pg_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        _check(engine)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}"'))
        admin.dispose()


def test_comparison_sees_a_model_change(tmp_path: Path) -> None:
    """The check is not vacuous: a column the migrations never created is reported."""
    engine = make_engine(f"sqlite:///{tmp_path / 'fleet.db'}")
    try:
        migrate(engine)
        extra = models()
        extra.tables["nodes"].append_column(sa.Column("firmware_channel", sa.String(32)))
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn)
            diff = compare_metadata(ctx, extra)
        added = [d for d in diff if d[0] == "add_column"]
        assert [(d[2], d[3].name) for d in added] == [("nodes", "firmware_channel")]
    finally:
        engine.dispose()


def test_schema_head_is_alembics_head_and_a_current_database_skips_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate` answers a database already at `SCHEMA_HEAD` from one query, without alembic
    (its import and script parsing cost every controller start ~0.37 s of CPU); the constant
    must name the newest migration, or a new migration would never run."""
    import alembic.command

    from gpufleet.control.db.engine import SCHEMA_HEAD

    assert head_revision() == SCHEMA_HEAD
    engine = make_engine(f"sqlite:///{tmp_path / 'fast.db'}")
    assert migrate(engine) == SCHEMA_HEAD  # a new database: alembic runs every migration

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("alembic ran on a database already at head")

    monkeypatch.setattr(alembic.command, "upgrade", refuse)
    assert migrate(engine) == SCHEMA_HEAD
    with engine.begin() as conn:  # one behind: alembic is asked again
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0009'"))
    with pytest.raises(ConfigError, match="alembic ran"):  # migrate names a failed upgrade
        migrate(engine)
