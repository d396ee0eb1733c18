"""A database written by a newer release is refused with one clear line, and left unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gpufleet.control.db.engine import head_revision, migrate
from gpufleet.errors import ConfigError


def test_newer_revision_refused_and_database_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "gpufleet.db"
    engine = create_engine(f"sqlite:///{db}")
    migrate(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    before = db.read_bytes()
    with pytest.raises(ConfigError) as err:
        migrate(engine)
    message = str(err.value)
    assert "9999" in message and "newer than this gpufleet" in message
    assert head_revision() in message
    assert "\n" not in message
    engine.dispose()
    assert db.read_bytes() == before
