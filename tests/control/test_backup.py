"""`gpufleet controller backup` / `restore` on SQLite and PostgreSQL: a round trip gives back
every row of every table (nodes, GPUs, tokens, jobs with their protected env, findings,
audit); a running controller is backed up live and never restored over; a corrupt or foreign
file changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, select

from gpufleet.control.db.engine import database_url, make_engine
from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.control.conftest import _reset_pg
from tests.integration.conftest import embedded, fleet_of

pytestmark = pytest.mark.process


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "controller", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def where(db: dict[str, Any]) -> list[str]:
    return ["--db-url", db["db_url"]] if db.get("db_url") else ["--data-dir", str(db["data_dir"])]


def every_row(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = make_engine(url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        out = {}
        with engine.connect() as c:
            for name, table in sorted(meta.tables.items()):
                order = list(table.primary_key.columns) or list(table.columns)
                out[name] = [tuple(r) for r in c.execute(select(table).order_by(*order))]
        return out
    finally:
        engine.dispose()


def test_round_trip_gives_back_every_row(db_config: dict[str, Any], tmp_path: Path) -> None:
    """A controller with real agents (one with a GPU fault) and a job with a secret in its env;
    backed up while it runs, then stopped: the restore holds every row the database held."""
    data = db_config.get("data_dir") or tmp_path / "data"
    ctl = Controller(data, db_url=db_config.get("db_url")).start()
    fleet = fleet_of(["n1", "n2"])
    agents = Agents(ctl.url, ctl.token("agent"), fleet, tokens=ctl.node_tokens(fleet)).start()
    archive = tmp_path / "gpufleet.backup"
    try:
        wait_for(lambda: len(embedded(ctl).store.nodes()) == 2, 20, "agents offer job slots")
        job = {"name": "train", "command": ["sim"], "duration_s": 60, "env": {"HF_TOKEN": "hf_x"}}
        posted = ctl.call("POST", "/api/v1/jobs", json=job)
        assert posted.status_code == 201, posted.text
        agents.inject_xid79("n2", 1)

        def n2_finding() -> bool:
            found = ctl.call("GET", "/api/v1/findings").json()
            return any(f["node"] == "n2" for f in found)

        wait_for(n2_finding, 20, "n2's XID finding")
        live = cli("backup", "--to", str(tmp_path / "live.backup"), *where(db_config))
        assert live.returncode == 0, live.stderr  # a consistent copy while it ingests
    finally:
        agents.stop()
        ctl.stop()
    url = database_url(db_config.get("data_dir"), db_config.get("db_url"))
    before = every_row(url)
    assert all(before[t] for t in ("nodes", "gpus", "findings", "audit_log", "sched_jobs"))
    assert len(before["api_tokens"]) >= 4
    r = cli("backup", "--to", str(archive), *where(db_config))
    assert r.returncode == 0, r.stderr
    assert archive.stat().st_mode & 0o777 == 0o600
    # restoring over a database that holds nodes needs --force, and changes nothing without it
    r = cli("restore", str(archive), *where(db_config))
    assert r.returncode == 2 and "--force" in r.stderr
    if db_config.get("db_url"):
        _reset_pg(db_config["db_url"])  # a new, empty database
        target = dict(db_config)
    else:
        target = {"data_dir": tmp_path / "restored"}
    r = cli("restore", str(archive), *where(target))
    assert r.returncode == 0, r.stderr
    after = every_row(database_url(target.get("data_dir"), target.get("db_url")))
    assert after == before
    if target.get("data_dir"):
        assert (target["data_dir"] / "gpufleet.db").stat().st_mode & 0o777 == 0o600
        # the key that seals job specs travels with the backup, or the env would be unreadable
        key = target["data_dir"] / "job-env.key"
        assert key.read_bytes() == (data / "job-env.key").read_bytes()
        assert key.stat().st_mode & 0o777 == 0o600


def test_corrupt_or_foreign_files_change_nothing(tmp_path: Path) -> None:
    data = tmp_path / "d"
    create_tokens(data, {"a": ("admin", None)})
    archive = tmp_path / "b.tar"
    assert cli("backup", "--to", str(archive), "--data-dir", str(data)).returncode == 0
    # flip bytes inside the database member: the checksum refuses it
    raw = bytearray(archive.read_bytes())
    with tarfile.open(archive) as tar:
        member = tar.getmember("database.sqlite")
    raw[member.offset_data + 200] ^= 0xFF
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(raw))
    target = tmp_path / "t"
    r = cli("restore", str(bad), "--data-dir", str(target))
    assert r.returncode == 2 and "checksum" in r.stderr and "Traceback" not in r.stderr
    assert not (target / "gpufleet.db").exists() or (target / "gpufleet.db").stat().st_size == 0
    junk = tmp_path / "junk.tar"
    junk.write_text("not a tar")
    r = cli("restore", str(junk), "--data-dir", str(target))
    assert r.returncode == 2 and "not a gpufleet backup" in r.stderr


def test_live_backup_of_a_running_controller_and_restore_refused_while_it_runs(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    tokens = create_tokens(data, {"admin": ("admin", None), "viewer": ("viewer", None)})
    admin = tokens["admin"]
    ctl = ControllerProcess(data, admin).start()
    try:
        archive = tmp_path / "live.backup"
        r = cli("backup", "--to", str(archive), "--data-dir", str(data))
        assert r.returncode == 0, r.stderr
        r = cli("restore", str(archive), "--data-dir", str(data), "--force")
        assert r.returncode == 2 and "stop it first" in r.stderr
        # a second controller on the same SQLite database is refused the same way
        second = cli("serve", "--data-dir", str(data), "--port", "1")
        assert second.returncode == 2 and "stop it first" in second.stderr, second.stderr
    finally:
        ctl.stop()
    restored = tmp_path / "r"
    assert cli("restore", str(archive), "--data-dir", str(restored)).returncode == 0
    again = ControllerProcess(restored, admin).start()  # the old admin token still works
    try:
        summary = httpx.get(
            again.url + "/api/v1/summary",
            headers={"Authorization": f"Bearer {tokens['viewer']}"},
            timeout=10,
        )
        assert summary.status_code == 200  # and so does the viewer's
    finally:
        again.stop()


def test_a_crafted_member_name_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Issue 29: a `keys/NAME` member listed in the manifest wrote any file of the data dir."""
    import hashlib
    import io
    import json

    data = tmp_path / "d"
    create_tokens(data, {"a": ("admin", None)})
    archive = tmp_path / "b.tar"
    assert cli("backup", "--to", str(archive), "--data-dir", str(data)).returncode == 0
    evil, crafted = b"receivers: [evil]\n", tmp_path / "crafted.tar"
    with tarfile.open(archive) as src, tarfile.open(crafted, "w") as out:
        manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
        manifest["members"]["keys/notify.yaml"] = hashlib.sha256(evil).hexdigest()
        for m in src.getmembers():
            if m.name != "manifest.json":
                out.addfile(m, src.extractfile(m))
        for name, body in (
            ("manifest.json", json.dumps(manifest).encode()),
            ("keys/notify.yaml", evil),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            out.addfile(info, io.BytesIO(body))
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    r = cli("restore", str(crafted), "--data-dir", str(data), "--force")
    assert r.returncode == 2 and "keys/notify.yaml" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    after = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    assert "notify.yaml" not in after
    # controller.lock holds the restoring process id; nothing else may change
    assert {k for k in after if after[k] != before.get(k)} <= {"controller.lock"}


# --- issue 29: every member checked (name, type, size, checksum, the database itself) before
# anything is replaced; each crafted archive below is refused with one line naming the member
# and leaves the data directory byte for byte as it was.

MiB = 1 << 20


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A data directory (a migrated database with a token, a job-env key) and its backup,
    written by the real `backup` in this process (one CLI start less per test)."""
    from gpufleet.control.db.backup import backup
    from gpufleet.control.db.engine import current_revision

    root = tmp_path_factory.mktemp("origin")
    data = root / "d"
    create_tokens(data, {"a": ("admin", None)})
    (data / "job-env.key").write_bytes(os.urandom(32))
    (data / "job-env.key").chmod(0o600)
    url = database_url(data, None)
    engine = make_engine(url)
    try:
        rev = current_revision(engine)
    finally:
        engine.dispose()
    archive = root / "b.tar"
    backup(url, data, archive, rev)
    return data, archive


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, link: str = "") -> Any:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname, info.mode = size, kind, link, 0o600
    return info


def _parts(archive: Path) -> tuple[dict[str, Any], list[tuple[Any, bytes]]]:
    import json

    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        rest = [
            (m, tar.extractfile(m).read())  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name != "manifest.json"
        ]
    return manifest, rest


def _write(
    dest: Path, manifest: dict[str, Any], members: list[tuple[Any, bytes]], mode: str = "w"
) -> Path:
    import io
    import json

    body = json.dumps(manifest).encode()
    with tarfile.open(dest, mode) as out:  # type: ignore[call-overload]
        out.addfile(_info("manifest.json", len(body)), io.BytesIO(body))
        for info, data in members:
            out.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return dest


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


def _swap(
    members: list[tuple[Any, bytes]], name: str, info: Any, data: bytes = b""
) -> list[tuple[Any, bytes]]:
    return [(info, data) if m.name == name else (m, d) for m, d in members]


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


KEY = "keys/job-env.key"
ODD: dict[str, Any] = {
    # case: (craft(members) -> members, the member named, what the message says it is)
    "directory": (lambda ms: _swap(ms, KEY, _info(KEY, kind=tarfile.DIRTYPE)), KEY, "directory"),
    "nested": (
        lambda ms: [*ms, (_info("keys/sub/job-env.key", 3), b"abc")],
        "keys/sub/job-env.key",
        "not one a backup writes",
    ),
    "symlink": (
        lambda ms: _swap(
            ms, "database.sqlite", _info("database.sqlite", 0, tarfile.SYMTYPE, "/etc/passwd")
        ),
        "database.sqlite",
        "symbolic link",
    ),
    "hardlink": (
        lambda ms: _swap(ms, KEY, _info(KEY, 0, tarfile.LNKTYPE, "database.sqlite")),
        KEY,
        "hard link",
    ),
    "absolute": (
        lambda ms: [*ms, (_info("/etc/cron.d/gpufleet", 4), b"evil")],
        "/etc/cron.d/gpufleet",
        "absolute path",
    ),
    "dotdot": (
        lambda ms: [*ms, (_info("keys/../../escape", 4), b"evil")],
        "keys/../../escape",
        "'..'",
    ),
    "device": (lambda ms: _swap(ms, KEY, _info(KEY, kind=tarfile.CHRTYPE)), KEY, "device file"),
    "duplicate": (
        lambda ms: [*ms, (_info("database.sqlite", 5), b"evil!")],
        "database.sqlite",
        "twice",
    ),
}


def _refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr


@pytest.mark.parametrize("case", sorted(ODD))
def test_an_odd_member_is_refused_naming_it_and_changes_nothing(
    case: str, origin: tuple[Path, Path], tmp_path: Path
) -> None:
    """Old code: the unlisted members were ignored (exit 0, restored), the listed ones were
    'missing' or a checksum failure without saying why; none named what the member is."""
    import shutil

    craft, name, says = ODD[case]
    data = shutil.copytree(origin[0], tmp_path / "d")
    manifest, members = _parts(origin[1])
    crafted = _write(tmp_path / f"{case}.tar", manifest, craft(members))
    before = _snapshot(data)
    r = cli("restore", str(crafted), "--data-dir", str(data), "--force")
    _refused(r, name, says)
    assert _snapshot(data) == before


@pytest.mark.parametrize(
    ("zeros", "args"), [(32 * MiB, []), (4 * MiB, ["--max-size", "1M"])], ids=["default", "flag"]
)
def test_a_compressed_bomb_is_refused_while_extracting(
    zeros: int, args: list[str], origin: tuple[Path, Path], tmp_path: Path
) -> None:
    """A gzip member of zeros claimed as the database, its checksum right: old code wrote it all
    out, passed the checksum, then SQLite's 'file is not a database' came out as a traceback."""
    import shutil

    data = shutil.copytree(origin[0], tmp_path / "d")
    manifest, members = _parts(origin[1])
    bomb = bytes(zeros)
    manifest["members"]["database.sqlite"] = _sha(bomb)
    members = _swap(members, "database.sqlite", _info("database.sqlite", len(bomb)), bomb)
    crafted = _write(tmp_path / "bomb.tar.gz", manifest, members, "w:gz")
    assert crafted.stat().st_size < zeros // 100
    before = _snapshot(data)
    r = cli("restore", str(crafted), "--data-dir", str(data), "--force", *args)
    _refused(r, "'database.sqlite'", "larger than", "--max-size")
    assert _snapshot(data) == before


def _database_with(origin: tuple[Path, Path], tmp_path: Path, case: str) -> bytes:
    import sqlite3

    if case == "not a database":
        return bytes(8192)
    copy = tmp_path / "copy.sqlite"
    _, members = _parts(origin[1])
    copy.write_bytes(dict((m.name, d) for m, d in members)["database.sqlite"])
    conn = sqlite3.connect(copy)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.close()
    return copy.read_bytes()


@pytest.mark.parametrize(
    ("case", "says"), [("not a database", "not an SQLite database"), ("newer revision", "9999")]
)
def test_a_database_that_cannot_be_used_is_refused_before_anything_is_replaced(
    case: str, says: str, origin: tuple[Path, Path], tmp_path: Path
) -> None:
    """Checksums right, the database itself wrong. Old code: the one of a newer release was
    put in place, then `migrate` refused it (the data directory already replaced); the zeros
    gave a traceback."""
    import shutil

    data = shutil.copytree(origin[0], tmp_path / "d")
    manifest, members = _parts(origin[1])
    body = _database_with(origin, tmp_path, case)
    manifest["members"]["database.sqlite"] = _sha(body)
    members = _swap(members, "database.sqlite", _info("database.sqlite", len(body)), body)
    crafted = _write(tmp_path / "db.tar", manifest, members)
    before = _snapshot(data)
    r = cli("restore", str(crafted), "--data-dir", str(data), "--force")
    _refused(r, "database.sqlite", says)
    assert _snapshot(data) == before


def test_a_gzipped_genuine_backup_restores_within_the_default_bound(
    origin: tuple[Path, Path], tmp_path: Path
) -> None:
    """The default bound of a compressed archive does not refuse a real one (a fresh database
    compresses ~60 times)."""
    import gzip

    gz = tmp_path / "b.tar.gz"
    gz.write_bytes(gzip.compress(origin[1].read_bytes()))
    target = tmp_path / "t"
    r = cli("restore", str(gz), "--data-dir", str(target))
    assert r.returncode == 0, r.stderr
    assert (target / "job-env.key").read_bytes() == (origin[0] / "job-env.key").read_bytes()
    assert every_row(database_url(target, None)) == every_row(database_url(origin[0], None))
