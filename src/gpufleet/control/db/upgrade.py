"""Upgrading gpufleet itself: before a database at an older schema revision is migrated, a backup
of it (`gpufleet.control.db.backup`) is written under ``<data-dir>/backups/`` and named in one
log line; when it cannot be written the migration is refused and nothing changes
(docs/control-plane.md, "Upgrading gpufleet")."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from gpufleet.control.db.backup import backup
from gpufleet.control.db.engine import (
    SCHEMA_HEAD,
    _refuse_unknown_revision,
    _stored_revision,
    migrate,
)
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.private import private_dir

log = logging.getLogger(__name__)

BACKUP_DIR = "backups"
# set to 1 to migrate without the backup (after taking one yourself, e.g. of a huge database)
SKIP_ENV = "GPUFLEET_SKIP_UPGRADE_BACKUP"


@dataclass(frozen=True)
class Migrated:
    """What a migration did: the revision before (None: a new database) and now, and the
    backup written before it (None: none was needed, or it was skipped by `SKIP_ENV`)."""

    revision: str
    from_revision: str | None
    backup: str | None


def backup_dir(url: str, data_dir: Path | None) -> Path:
    """``<data-dir>/backups``; without a data directory, beside an SQLite database file."""
    if data_dir is not None:
        return data_dir / BACKUP_DIR
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).parent / BACKUP_DIR
    raise ConfigError(
        "upgrade: no --data-dir to write the backup taken before migrating the database to; "
        "give --data-dir (or set GPUFLEET_DATA_DIR); nothing was changed"
    )


def backup_name(old: str, new: str, now_s: float) -> str:
    """``pre-upgrade-<old>-to-<new>-<UTC time>.tar`` (a plain tar, as `controller backup`)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
    return f"pre-upgrade-{old}-to-{new}-{stamp}.tar"


def migrate_with_backup(
    engine: Engine,
    url: str,
    data_dir: Path | None,
    *,
    clock: Callable[[], float] = time.time,
) -> Migrated:
    """Migrate to the newest revision; a database at an older one is backed up first (a newer
    one is refused before anything is written, by `engine.migrate`)."""
    stored = _stored_revision(engine)
    if stored is None or stored == SCHEMA_HEAD:
        return Migrated(migrate(engine), stored, None)
    _refuse_unknown_revision(engine)
    path: str | None = None
    if os.environ.get(SKIP_ENV) == "1":
        log.warning(
            "database at schema revision %s: migrating to %s without a backup (%s=1)",
            stored,
            SCHEMA_HEAD,
            SKIP_ENV,
        )
    else:
        path = _write_backup(url, data_dir, stored, clock())
        log.warning(
            "database at schema revision %s: backed up to %s before migrating to %s",
            stored,
            path,
            SCHEMA_HEAD,
        )
    return Migrated(migrate(engine), stored, path)


def _write_backup(url: str, data_dir: Path | None, old: str, now_s: float) -> str:
    where = backup_dir(url, data_dir)
    dest = where / backup_name(old, SCHEMA_HEAD, now_s)
    try:
        private_dir(where)
        return backup(url, data_dir, dest, old).path
    except (OSError, GpufleetError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            f"database at schema revision {old}: the backup before migrating it to {SCHEMA_HEAD} "
            f"could not be written to {dest} ({why}); migration refused, nothing was changed "
            f"(free space or fix {where}, or take a backup yourself and set {SKIP_ENV}=1)"
        ) from exc
