"""Upgrading on PostgreSQL (replicas share one database, docs/control-plane.md "Upgrading
gpufleet"): a database at the previous release's revision is dumped (``pg_dump``) under the data
directory before it is migrated, and that dump holds the old revision."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from gpufleet.control.db.engine import SCHEMA_HEAD, make_engine, migrate
from gpufleet.control.db.upgrade import migrate_with_backup
from tests.control.conftest import _reset_pg, pg_url  # noqa: F401  (the PostgreSQL fixture)

pytestmark = pytest.mark.process

OLD = "0011"  # the previous release's head (tests/fixtures/upgrade/109ee82/manifest.json)


def test_a_replica_backs_up_the_shared_database_before_migrating_it(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    _reset_pg(pg_url)
    engine = make_engine(pg_url)
    try:
        assert migrate(engine, OLD) == OLD  # as the previous release left it
        data = tmp_path / "replica-1"
        done = migrate_with_backup(engine, pg_url, data)
        assert (done.from_revision, done.revision) == (OLD, SCHEMA_HEAD)
        (dump,) = (data / "backups").iterdir()
        assert str(dump) == done.backup
        assert dump.name.startswith(f"pre-upgrade-{OLD}-to-{SCHEMA_HEAD}-")
        assert stat.S_IMODE(dump.stat().st_mode) == 0o600
        with engine.connect() as c:
            now = c.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert now == SCHEMA_HEAD
        # a second replica started on the migrated database takes no backup
        assert migrate_with_backup(engine, pg_url, tmp_path / "replica-2").backup is None
    finally:
        engine.dispose()
    subprocess.run(["tar", "-xf", str(dump), "-C", str(tmp_path)], check=True)
    pgdump = tmp_path / "database.pgdump"
    rows = subprocess.run(
        ["pg_restore", "--data-only", "--table=alembic_version", "--file=-", str(pgdump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"\n{OLD}\n" in rows and f"\n{SCHEMA_HEAD}\n" not in rows
