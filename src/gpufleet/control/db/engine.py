"""Database engine: SQLite in WAL mode under a data directory by default, PostgreSQL (psycopg 3)
by URL; schema managed by the packaged Alembic migrations (`gpufleet controller migrate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.errors import ConfigError
from gpufleet.jsonable import to_jsonable
from gpufleet.private import private_dir, private_file, tighten

DB_FILE = "gpufleet.db"
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def database_url(data_dir: Path | None, db_url: str | None) -> str:
    """``--db-url`` wins; else ``sqlite:///<data-dir>/gpufleet.db`` (the directory is created)."""
    if db_url:
        if db_url.startswith("postgresql://") or db_url.startswith("postgres://"):
            # psycopg 3 is the driver we ship with; plain URLs would pick psycopg2.
            db_url = "postgresql+psycopg://" + db_url.split("://", 1)[1]
        if not (db_url.startswith("sqlite") or db_url.startswith("postgresql")):
            raise ConfigError(f"--db-url {db_url.split(':', 1)[0]}: only sqlite and postgresql")
        return db_url
    if data_dir is None:
        raise ConfigError("either --data-dir or --db-url is needed")
    try:
        # private: the database and its WAL hold job environments (API keys) and token hashes;
        # SQLite gives -wal and -shm the mode of the database file
        private_dir(data_dir)
        for name in (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"):
            tighten(data_dir / name)
        private_file(data_dir / DB_FILE)
    except OSError as exc:
        raise ConfigError(f"--data-dir {data_dir}: {exc.strerror or exc}") from exc
    return f"sqlite:///{data_dir / DB_FILE}"


def json_serializer(obj: Any) -> str:
    """Strict JSON for JSON columns: NaN and infinities become null (PostgreSQL rejects them)."""
    return json.dumps(to_jsonable(obj), allow_nan=False, default=str)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers never block the single writer. synchronous=FULL fsyncs the WAL on every commit,
    # so an acknowledged batch survives power loss, not only a killed process (SQLite docs,
    # "Write-Ahead Logging" and "PRAGMA synchronous"). Group commit amortises the fsync.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine with the right settings for SQLite (WAL, FULL sync) or PostgreSQL."""
    try:
        if url.startswith("sqlite"):
            engine = create_engine(
                url,
                echo=echo,
                connect_args={"check_same_thread": False, "timeout": 10},
                json_serializer=json_serializer,
            )
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(
                url,
                echo=echo,
                pool_size=8,
                max_overflow=8,
                pool_pre_ping=True,
                json_serializer=json_serializer,
            )
    except Exception as exc:  # bad URL, missing driver
        raise ConfigError(f"database URL: {exc}") from exc
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


# The newest migration's revision (tests/control/test_migrations.py holds it equal to
# alembic's head): a database already there is not handed to alembic, whose import and
# script parsing cost ~0.37 s of CPU on every controller start.
SCHEMA_HEAD = "0012"


def _stored_revision(engine: Engine) -> str | None:
    """The revision in ``alembic_version`` read with one query; None when there is none."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    except SQLAlchemyError:  # no such table yet: a new database
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


def migrate(engine: Engine, revision: str = "head") -> str:
    """Bring the schema up to ``revision``; returns the revision now applied."""
    if revision == "head" and _stored_revision(engine) == SCHEMA_HEAD:
        return SCHEMA_HEAD
    from alembic import command

    _refuse_unknown_revision(engine)
    try:
        command.upgrade(_alembic_config(engine), revision)
    except Exception as exc:
        raise ConfigError(f"database migration failed: {exc}") from exc
    return current_revision(engine) or ""


def _refuse_unknown_revision(engine: Engine) -> None:
    """Refuse a database whose revision this code does not know (written by a newer release)."""
    from alembic.script import ScriptDirectory

    stored = _stored_revision(engine)
    if stored is None:
        return
    script = ScriptDirectory.from_config(_alembic_config(engine))
    known = {rev.revision for rev in script.walk_revisions()}
    if stored not in known:
        raise ConfigError(
            f"database schema revision {stored} is newer than this gpufleet "
            f"(knows up to {script.get_current_head()}): upgrade gpufleet to the release "
            "that wrote it, or restore a backup taken before the upgrade; nothing was changed"
        )


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    return head or ""


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())
