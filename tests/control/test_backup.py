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
