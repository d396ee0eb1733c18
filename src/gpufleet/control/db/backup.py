"""Backup and restore of the control plane's state: the database (nodes, GPUs, tokens, jobs,
findings, audit, policy) and the key files that protect stored secrets.

A backup is one tar file, written 0600:

- ``manifest.json``: format, version, database kind, schema revision, time, SHA-256 of each
  member;
- ``database.sqlite`` (SQLite's online backup API: a consistent copy while the controller
  runs, WAL included; https://www.sqlite.org/backup.html) or ``database.pgdump``
  (``pg_dump --format=custom``, https://www.postgresql.org/docs/current/app-pgdump.html);
- ``keys/<name>``: the data directory's key files (`KEY_FILES`) where present.

Restore checks every member's hash before touching anything, refuses to overwrite a database
that holds data unless told to (``force``), refuses while a controller holds the data
directory's lock (`controller_lock`), replaces an SQLite database atomically, restores a
PostgreSQL dump with ``pg_restore --clean --if-exists``, then migrates to the current schema.
What a restore loses: whatever was written after the backup (at most the current minute's
rollups when backups run every minute).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpufleet.errors import ConfigError, UsageError
from gpufleet.schedulers.embedded.sealing import KEY_FILE as SEALING_KEY

FORMAT = "gpufleet-backup"
VERSION = 1
LOCK_FILE = "controller.lock"
# Files of the data directory that protect stored secrets; restored next to the database.
KEY_FILES = (SEALING_KEY,)
_ALLOWED_MEMBERS = frozenset(
    {"database.sqlite", "database.pgdump", *(f"keys/{k}" for k in KEY_FILES)}
)
PG_TIMEOUT_S = 600


@dataclass(frozen=True)
class BackupInfo:
    """What a backup holds."""

    path: str
    database: str  # sqlite or postgresql
    revision: str | None
    created_s: float
    members: dict[str, str]  # name -> sha256
    bytes: int


def _sqlite_path(url: str) -> Path | None:
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            return Path(url[len(prefix) :])
    return None


def _pg_plain(url: str) -> str:
    """A libpq URL (``postgresql://``) from SQLAlchemy's ``postgresql+psycopg://``."""
    return "postgresql://" + url.split("://", 1)[1]


@contextlib.contextmanager
def controller_lock(data_dir: Path, *, what: str) -> Iterator[None]:
    """Hold the data directory's controller lock (one controller per SQLite database); a clear
    error naming the holder when another process has it."""
    from gpufleet.private import private_dir

    try:
        path = private_dir(data_dir) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"{what}: {data_dir}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise UsageError(
                f"{what}: a controller (pid {holder}) is using {data_dir}: stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _write_private(dest: Path) -> IO[bytes]:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def backup(url: str, data_dir: Path | None, dest: Path, revision: str | None) -> BackupInfo:
    """Write a backup of the database at ``url`` (and ``data_dir``'s key files) to ``dest``."""
    dest = dest.expanduser()
    if dest.is_dir():
        raise UsageError(f"--to {dest}: is a directory; give a file name")
    with tempfile.TemporaryDirectory(prefix="gpufleet-backup-") as tmp:
        work = Path(tmp)
        sqlite_path = _sqlite_path(url)
        if sqlite_path is not None:
            kind, member = "sqlite", "database.sqlite"
            _sqlite_copy(sqlite_path, work / member)
        else:
            kind, member = "postgresql", "database.pgdump"
            _pg_dump(url, work / member)
        members = {member: work / member}
        for name in KEY_FILES:
            if data_dir is not None and (data_dir / name).is_file():
                members[f"keys/{name}"] = data_dir / name
        hashes = {name: _sha256(p) for name, p in members.items()}
        created = time.time()
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "database": kind,
            "revision": revision,
            "created_s": created,
            "members": hashes,
        }
        part = dest.with_name(dest.name + ".part")
        try:
            with _write_private(part) as fh, tarfile.open(fileobj=fh, mode="w") as tar:
                raw = json.dumps(manifest, indent=1).encode()
                info = tarfile.TarInfo("manifest.json")
                info.size, info.mode, info.mtime = len(raw), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(raw))
                for name, p in members.items():
                    tar.add(p, arcname=name, recursive=False, filter=_private_member)
            os.replace(part, dest)
        except OSError as exc:
            with contextlib.suppress(OSError):
                part.unlink()
            raise UsageError(f"--to {dest}: {exc.strerror or exc}") from exc
    return BackupInfo(str(dest), kind, revision, created, hashes, dest.stat().st_size)


def _private_member(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
    return info


def _sqlite_copy(src: Path, dest: Path) -> None:
    if not src.is_file() or src.stat().st_size == 0:
        raise ConfigError(f"no database at {src}: nothing to back up")
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30)
    target = sqlite3.connect(dest)
    try:
        source.backup(target)  # a consistent snapshot while writers go on
    finally:
        target.close()
        source.close()
    os.chmod(dest, 0o600)


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PG_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise ConfigError(
            f"{what}: {argv[0]} not found (install PostgreSQL's client tools, e.g. Debian's "
            "postgresql-client)"
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: {argv[0]} did not finish within {PG_TIMEOUT_S} s") from None
    if done.returncode != 0:
        # pg tools name the database, never the password (it comes from the URL or ~/.pgpass)
        raise ConfigError(f"{what}: {argv[0]} failed: {done.stderr.strip()[:300]}")


def _pg_dump(url: str, dest: Path) -> None:
    _run(
        [
            "pg_dump",
            "--format=custom",
            "--no-owner",
            f"--file={dest}",
            f"--dbname={_pg_plain(url)}",
        ],
        "backup",
    )
    os.chmod(dest, 0o600)


def read_manifest(src: Path) -> dict[str, Any]:
    """The backup's manifest, after checking that ``src`` is a gpufleet backup."""
    try:
        with tarfile.open(src, mode="r") as tar:
            fh = tar.extractfile("manifest.json")
            manifest = json.loads(fh.read()) if fh is not None else None
    except (OSError, tarfile.TarError, KeyError, json.JSONDecodeError) as exc:
        raise UsageError(f"{src}: not a gpufleet backup ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError(f"{src}: not a gpufleet backup (no {FORMAT} manifest)")
    if manifest.get("version") != VERSION:
        raise UsageError(f"{src}: backup format version {manifest.get('version')} is not {VERSION}")
    return manifest


def _extract_checked(src: Path, work: Path, manifest: dict[str, Any]) -> dict[str, Path]:
    members: dict[str, str] = manifest.get("members") or {}
    out: dict[str, Path] = {}
    with tarfile.open(src, mode="r") as tar:
        for name, digest in members.items():
            if name not in _ALLOWED_MEMBERS:  # never a path a crafted archive chose
                raise UsageError(f"{src}: member {name!r} is not one a backup writes: refused")
            try:
                fh = tar.extractfile(name)
            except KeyError:
                fh = None
            if fh is None:
                raise UsageError(f"{src}: member {name} is missing: the backup is incomplete")
            target = work / name.replace("/", "__")
            with _write_private(target) as out_fh:
                shutil.copyfileobj(fh, out_fh)
            if _sha256(target) != digest:
                raise UsageError(
                    f"{src}: member {name} does not match its checksum: corrupt backup"
                )
            out[name] = target
    return out


def _has_data(url: str) -> bool:
    from sqlalchemy import inspect, text

    from gpufleet.control.db.engine import make_engine

    path = _sqlite_path(url)
    if path is not None and (not path.exists() or path.stat().st_size == 0):
        return False
    engine = make_engine(url)
    try:
        if "nodes" not in inspect(engine).get_table_names():
            return False
        with engine.connect() as c:
            return bool(c.execute(text("SELECT count(*) FROM nodes")).scalar())
    finally:
        engine.dispose()


def restore(src: Path, url: str, data_dir: Path | None, *, force: bool = False) -> dict[str, Any]:
    """Restore the backup ``src`` into the database at ``url`` (and its key files into
    ``data_dir``); returns the manifest. Nothing changes when a check fails."""
    src = src.expanduser()
    manifest = read_manifest(src)
    sqlite_path = _sqlite_path(url)
    kind = "sqlite" if sqlite_path is not None else "postgresql"
    if manifest.get("database") != kind:
        raise UsageError(
            f"{src}: a {manifest.get('database')} backup cannot be restored into {kind} "
            "(restore into the same kind, then move the data with your usual tools)"
        )
    with contextlib.ExitStack() as stack:
        if data_dir is not None:
            stack.enter_context(controller_lock(data_dir, what="restore"))
        if not force and _has_data(url):
            raise UsageError(
                "restore: the target database already holds nodes; pass --force to replace it"
            )
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpufleet-restore-")))
        files = _extract_checked(src, work, manifest)
        if sqlite_path is not None:
            _sqlite_restore(files["database.sqlite"], sqlite_path)
        else:
            _run(
                [
                    "pg_restore",
                    "--clean",
                    "--if-exists",
                    "--no-owner",
                    "--single-transaction",
                    f"--dbname={_pg_plain(url)}",
                    str(files["database.pgdump"]),
                ],
                "restore",
            )
        for name, path in files.items():
            if name.startswith("keys/") and data_dir is not None:
                key = data_dir / name.removeprefix("keys/")
                tmp = key.with_name(key.name + ".part")
                shutil.copyfile(path, tmp)
                os.chmod(tmp, 0o600)
                os.replace(tmp, key)
    return manifest


def _sqlite_restore(copy: Path, target: Path) -> None:
    check = sqlite3.connect(copy)
    try:
        ok = check.execute("PRAGMA integrity_check").fetchone()
    finally:
        check.close()
    if not ok or ok[0] != "ok":
        raise UsageError(f"restore: the backed-up database fails SQLite's integrity check: {ok}")
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(target.name + ".restore")
    shutil.copyfile(copy, tmp)
    os.chmod(tmp, 0o600)
    for side in ("-wal", "-shm"):  # the old database's log must not replay over the new one
        with contextlib.suppress(FileNotFoundError):
            (target.parent / f"{target.name}{side}").unlink()
    os.replace(tmp, target)
