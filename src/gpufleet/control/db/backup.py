"""Backup and restore of the control plane's state: the database (nodes, GPUs, tokens, jobs,
findings, audit, policy) and the key files that protect stored secrets.

A backup is one tar file, written 0600:

- ``manifest.json``: format, version, database kind, schema revision, time, SHA-256 of each
  member;
- ``database.sqlite`` (SQLite's online backup API: a consistent copy while the controller
  runs, WAL included; https://www.sqlite.org/backup.html) or ``database.pgdump``
  (``pg_dump --format=custom``, https://www.postgresql.org/docs/current/app-pgdump.html);
- ``keys/<name>``: the data directory's key files (`KEY_FILES`) where present.

Restore reads the archive once into a temporary directory and checks everything before touching
anything: only regular members with the names a backup writes, each once, each within a size
bound counted as it is read (`default_max_size`, or ``max_size``), each matching its SHA-256;
the database opens and holds a schema revision this code knows. Then it refuses to overwrite a
database that holds data unless told to (``force``), refuses while a controller holds the data
directory's lock (`controller_lock`), replaces an SQLite database atomically, restores a
PostgreSQL dump with ``pg_restore --clean --if-exists``, then migrates to the current schema.
What a restore loses: whatever was written after the backup (at most the current minute's
rollups when backups run every minute).
"""

from __future__ import annotations

import bz2
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
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
MANIFEST_MAX_BYTES = 1 << 20
# A compressed archive's members may each expand this many times its size, and to this at least.
COMPRESSED_RATIO = 100
COMPRESSED_FLOOR = 16 << 20
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))
_UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)
_ODD_TYPES = {
    tarfile.DIRTYPE: "a directory",
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a device file (character)",
    tarfile.BLKTYPE: "a device file (block)",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


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


def _run(argv: list[str], what: str) -> str:
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
    return done.stdout


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


def default_max_size(src: Path) -> int:
    """The default bound on one member's size: a member of a plain tar (what `backup` writes)
    is never larger than the file itself; a compressed one may expand `COMPRESSED_RATIO` times
    its size, and at least to `COMPRESSED_FLOOR` (a fresh database compresses ~60 times)."""
    size = _stat(src).st_size
    return size if _decompressor(src) is None else max(size * COMPRESSED_RATIO, COMPRESSED_FLOOR)


def _stat(src: Path) -> os.stat_result:
    try:
        return src.stat()
    except OSError as exc:
        raise UsageError(f"{src}: {exc.strerror or exc}") from None


def _decompressor(src: Path) -> str | None:
    try:
        with src.open("rb") as fh:
            head = fh.read(6)
    except OSError as exc:
        raise UsageError(f"{src}: {exc.strerror or exc}") from None
    return next((kind for magic, kind in _COMPRESSED if head.startswith(magic)), None)


def _open_raw(src: Path, kind: str | None) -> IO[bytes]:
    if kind == "gzip":
        return gzip.open(src, "rb")  # type: ignore[return-value]
    if kind == "bz2":
        return bz2.open(src, "rb")
    return lzma.open(src, "rb") if kind == "xz" else src.open("rb")


class _Counted(io.RawIOBase):
    """The archive's bytes as tarfile reads them (decompressed), refused past ``limit``:
    headers and padding count too, so no long name or filler expands without bound."""

    def __init__(self, raw: IO[bytes], limit: int, src: Path) -> None:
        super().__init__()
        self._raw, self._limit, self._src, self.count = raw, limit, src, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self._raw.read(len(buf))
        buf[: len(data)] = data
        self.count += len(data)
        if self.count > self._limit:
            raise UsageError(
                f"{self._src}: expands past {self._limit:,} bytes: refused (pass --max-size "
                "BYTES if the backup is genuine)"
            )
        return len(data)


@contextlib.contextmanager
def _open_archive(src: Path, limit: int) -> Iterator[tarfile.TarFile]:
    """``src`` as a tar read in one pass (stream mode), decompressed by us, every byte
    counted against ``limit``."""
    try:
        with contextlib.ExitStack() as stack:
            raw = stack.enter_context(_open_raw(src, _decompressor(src)))
            counted = stack.enter_context(_Counted(raw, limit, src))
            yield stack.enter_context(tarfile.open(fileobj=counted, mode="r|"))
    except _UNREADABLE as exc:
        raise UsageError(f"{src}: not a gpufleet backup (not a readable tar: {exc})") from None


def _check_member(src: Path, m: tarfile.TarInfo, seen: set[str]) -> None:
    """Refuse a member a backup never writes, naming it and saying what it is."""
    what = f"{src}: member {m.name!r}"
    if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or m.sparse is not None:
        kind = _ODD_TYPES.get(m.type, f"not a regular file (tar type {m.type!r})")
        link = f" to {m.linkname!r}" if m.linkname else ""
        raise UsageError(f"{what} is {kind}{link}: refused (a backup holds only regular files)")
    if m.name.startswith("/"):
        raise UsageError(f"{what} is an absolute path: refused")
    if ".." in PurePosixPath(m.name).parts:
        raise UsageError(f"{what} climbs out of its directory with '..': refused")
    if m.name in seen:
        raise UsageError(f"{what} appears twice in the archive: refused")
    if m.name != "manifest.json" and m.name not in _ALLOWED_MEMBERS:
        raise UsageError(f"{what} is not one a backup writes: refused")


def _manifest(src: Path, tar: tarfile.TarFile, m: tarfile.TarInfo) -> dict[str, Any]:
    fh = tar.extractfile(m)
    raw = fh.read(MANIFEST_MAX_BYTES + 1) if fh is not None else b""
    if len(raw) > MANIFEST_MAX_BYTES:
        raise UsageError(f"{src}: member 'manifest.json' is larger than {MANIFEST_MAX_BYTES:,}")
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{src}: not a gpufleet backup (manifest.json: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError(f"{src}: not a gpufleet backup (no {FORMAT} manifest)")
    if manifest.get("version") != VERSION:
        raise UsageError(f"{src}: backup format version {manifest.get('version')} is not {VERSION}")
    listed = manifest.get("members")
    if not isinstance(listed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in listed.items()
    ):
        raise UsageError(f"{src}: manifest.json: 'members' is not a map of name to SHA-256")
    for name in listed:
        if name not in _ALLOWED_MEMBERS:  # never a path a crafted archive chose
            raise UsageError(f"{src}: member {name!r} is not one a backup writes: refused")
    return manifest


def _too_big(src: Path, name: str, bound: int) -> UsageError:
    return UsageError(
        f"{src}: member {name!r} is larger than {bound:,} bytes, the restore's size bound: "
        "refused (pass --max-size BYTES if the backup is genuine)"
    )


def _copy_bounded(
    src: Path, tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, bound: int
) -> str:
    """Copy member ``m`` to ``dest``, counting its bytes as they come (never trusting its
    header's size alone); its SHA-256."""
    if m.size > bound:
        raise _too_big(src, m.name, bound)
    fh = tar.extractfile(m)
    if fh is None:  # a regular file always has data; kept for the type checker
        raise UsageError(f"{src}: member {m.name!r} has no data")
    digest, count = hashlib.sha256(), 0
    with _write_private(dest) as out:
        while chunk := fh.read(1 << 20):
            count += len(chunk)
            if count > bound:
                raise _too_big(src, m.name, bound)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def verify_archive(src: Path, work: Path, bound: int) -> tuple[dict[str, Any], dict[str, Path]]:
    """Read ``src`` once: every member's name, type and size, each copied into ``work`` and
    its checksum compared with the manifest's; the manifest and ``{member: copy}``. Nothing
    outside ``work`` is written."""
    budget = bound * len(_ALLOWED_MEMBERS) + MANIFEST_MAX_BYTES + (1 << 20)
    manifest: dict[str, Any] | None = None
    digests: dict[str, str] = {}
    seen: set[str] = set()
    with _open_archive(src, budget) as tar:
        for m in tar:
            _check_member(src, m, seen)
            seen.add(m.name)
            if m.name == "manifest.json":
                manifest = _manifest(src, tar, m)
            else:
                digests[m.name] = _copy_bounded(src, tar, m, _copy_of(work, m.name), bound)
    if manifest is None:
        raise UsageError(f"{src}: not a gpufleet backup (no manifest.json)")
    listed: dict[str, str] = manifest["members"]
    for name in digests:
        if name not in listed:
            raise UsageError(f"{src}: member {name!r} is not listed in the manifest: refused")
    for name, digest in listed.items():
        if name not in digests:
            raise UsageError(f"{src}: member {name} is missing: the backup is incomplete")
        if digests[name] != digest:
            raise UsageError(f"{src}: member {name} does not match its checksum: corrupt backup")
    return manifest, {name: _copy_of(work, name) for name in listed}


def _copy_of(work: Path, name: str) -> Path:
    return work / name.replace("/", "__")


def _known_revisions() -> tuple[set[str], str]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from gpufleet.control.db.engine import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(cfg)
    return {r.revision for r in script.walk_revisions()}, script.get_current_head() or ""


def _sqlite_revision(src: Path, copy: Path) -> str | None:
    what = f"{src}: member 'database.sqlite'"
    try:
        conn = sqlite3.connect(copy)
        try:
            ok = conn.execute("PRAGMA integrity_check").fetchone()
            if not ok or ok[0] != "ok":
                raise UsageError(f"{what} fails SQLite's integrity check: {ok}")
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if "alembic_version" not in tables:
                return None
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"{what} is not an SQLite database ({exc})") from None
    return str(rows[0][0]) if len(rows) == 1 else None


def _pgdump_revision(src: Path, dump: Path) -> str | None:
    what = f"{src}: member 'database.pgdump'"
    _run(["pg_restore", "--list", str(dump)], what)  # a custom-format dump, or its error
    script = _run(
        ["pg_restore", "--data-only", "--table=alembic_version", "--file=-", str(dump)], what
    )
    lines = iter(script.splitlines())
    for line in lines:
        if line.startswith("COPY ") and "alembic_version" in line:
            rows = [r for r in iter(lines.__next__, "\\.")]
            return rows[0].strip() if len(rows) == 1 else None
    return None


def _check_database(src: Path, name: str, copy: Path, manifest: dict[str, Any]) -> None:
    """The database opens and holds a schema revision this gpufleet knows (the manifest's)."""
    rev = _sqlite_revision(src, copy) if name == "database.sqlite" else _pgdump_revision(src, copy)
    what = f"{src}: member {name!r}"
    if rev is None:
        raise UsageError(f"{what} holds no gpufleet schema revision: not a gpufleet database")
    known, head = _known_revisions()
    if rev not in known:
        raise UsageError(
            f"{what} is at schema revision {rev}, newer than this gpufleet (knows up to "
            f"{head}): restore it with the release that wrote it; nothing was changed"
        )
    if manifest.get("revision") not in (None, rev):
        raise UsageError(
            f"{what} is at schema revision {rev}, its manifest says {manifest['revision']}: refused"
        )


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


def restore(
    src: Path,
    url: str,
    data_dir: Path | None,
    *,
    force: bool = False,
    max_size: int | None = None,
) -> dict[str, Any]:
    """Restore the backup ``src`` into the database at ``url`` (and its key files into
    ``data_dir``); returns the manifest. Every member (name, type, size, checksum) and the
    database itself are checked before anything is written outside a temporary directory,
    so nothing changes when a check fails. ``max_size`` bounds each member (bytes; default
    `default_max_size`)."""
    src = src.expanduser()
    sqlite_path = _sqlite_path(url)
    kind = "sqlite" if sqlite_path is not None else "postgresql"
    db_member = "database.sqlite" if sqlite_path is not None else "database.pgdump"
    bound = default_max_size(src) if max_size is None else max_size
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpufleet-restore-")))
        manifest, files = verify_archive(src, work, bound)
        if manifest.get("database") != kind or db_member not in files:
            raise UsageError(
                f"{src}: a {manifest.get('database')} backup cannot be restored into {kind} "
                "(restore into the same kind, then move the data with your usual tools)"
            )
        _check_database(src, db_member, files[db_member], manifest)
        # every check passed: from here on the target is touched
        if data_dir is not None:
            stack.enter_context(controller_lock(data_dir, what="restore"))
        if not force and _has_data(url):
            raise UsageError(
                "restore: the target database already holds nodes; pass --force to replace it"
            )
        keys = {
            data_dir / name.removeprefix("keys/"): copy
            for name, copy in files.items()
            if name.startswith("keys/") and data_dir is not None
        }
        _put_in_place(files[db_member], url, sqlite_path, keys)
    return manifest


def _private_copy(src: Path, dest: Path) -> None:
    with src.open("rb") as fh, _write_private(dest) as out:
        shutil.copyfileobj(fh, out)


def _put_in_place(db: Path, url: str, sqlite_path: Path | None, keys: dict[Path, Path]) -> None:
    """Stage the key files beside their targets, replace the database, then the keys."""
    staged: list[tuple[Path, Path]] = []
    try:
        for key, path in keys.items():
            part = key.with_name(key.name + ".part")
            staged.append((part, key))
            _private_copy(path, part)
        if sqlite_path is not None:
            _sqlite_restore(db, sqlite_path)
        else:
            _run(
                [
                    "pg_restore",
                    "--clean",
                    "--if-exists",
                    "--no-owner",
                    "--single-transaction",
                    f"--dbname={_pg_plain(url)}",
                    str(db),
                ],
                "restore",
            )
        for part, key in staged:
            os.replace(part, key)
    except OSError as exc:
        raise UsageError(f"restore: {exc.filename or ''}: {exc.strerror or exc}") from None
    finally:
        for part, _ in staged:
            with contextlib.suppress(OSError):
                part.unlink()


def _sqlite_restore(copy: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(target.name + ".restore")
    try:
        _private_copy(copy, tmp)
        for side in ("-wal", "-shm"):  # the old database's log must not replay over the new one
            with contextlib.suppress(FileNotFoundError):
                (target.parent / f"{target.name}{side}").unlink()
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
