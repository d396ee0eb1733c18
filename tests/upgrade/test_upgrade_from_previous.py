"""Upgrading gpufleet itself (issue 29): this release's controller, started as a real process on
a data directory written by the previous release (tests/fixtures/upgrade/109ee82, made by
scripts/make-upgrade-fixture.sh from that release's own code), backs the database up, migrates
it, and answers what the old controller answered; the old agent's batches are still accepted,
and a newer agent's batch is refused naming ``schema_version``."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import sqlite3
import stat
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.push import Pusher
from gpufleet.agent.spool import AgentState, Spool
from gpufleet.control.db.engine import SCHEMA_HEAD, database_url, make_engine
from gpufleet.control.db.upgrade import migrate_with_backup
from gpufleet.errors import ConfigError
from gpufleet.testing.procs import ControllerProcess
from gpufleet.wire.limits import SCHEMA_VERSION
from tests.integration.processes import GPUFLEET, cli, env_for

pytestmark = pytest.mark.process

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade" / "109ee82"
MANIFEST: dict[str, Any] = json.loads((FIXTURE / "manifest.json").read_text(encoding="utf-8"))
OLD = MANIFEST["schema_revision"]


def revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])


def shifted(obj: Any, delta: float) -> Any:
    """``obj`` with every time (a key ``t`` or ending in ``_s`` holding epoch seconds) moved on
    by ``delta``: the captured batch as the old agent would send it now."""
    if isinstance(obj, dict):
        return {
            k: (_move(v, delta) if k == "t" or k.endswith("_s") else shifted(v, delta))
            for k, v in obj.items()
        }
    return [shifted(v, delta) for v in obj] if isinstance(obj, list) else obj


def _move(v: Any, delta: float) -> Any:
    if isinstance(v, list):
        return [_move(x, delta) for x in v]
    epoch = isinstance(v, float | int) and not isinstance(v, bool) and 1.5e9 < v < 2.5e9
    return v + delta if epoch else shifted(v, delta)


def batch_body(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURE / "batches" / name).read_bytes())
    return doc


def picked(doc: Any, keys: tuple[str, ...]) -> Any:
    return [{k: row.get(k) for k in keys} for row in doc]


def kept(now: list[dict[str, Any]], was: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Every row the old release answered is answered now, the same in ``keys`` (rows written
    since, such as the node's move to lost without its agent, may come on top)."""
    assert was, "the fixture holds none"
    by_id = {row["id"]: row for row in picked(now, keys)}
    assert [by_id.get(row["id"]) for row in picked(was, keys)] == picked(was, keys)


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("upgrade")
    data = tmp / "data"
    shutil.copytree(FIXTURE / "data", data)
    data.chmod(0o700)
    assert revision(data / "gpufleet.db") == OLD != SCHEMA_HEAD
    ctl = ControllerProcess(data, MANIFEST["tokens"]["admin"]).start()
    try:
        yield ctl, tmp
    finally:
        ctl.stop()


def test_the_old_database_is_backed_up_then_migrated(upgraded: Any) -> None:
    ctl, tmp = upgraded
    data: Path = ctl.data_dir
    assert revision(data / "gpufleet.db") == SCHEMA_HEAD
    backups = sorted((data / "backups").glob(f"pre-upgrade-{OLD}-to-{SCHEMA_HEAD}-*.tar"))
    assert len(backups) == 1, sorted((data / "backups").iterdir())
    backup = backups[0]
    assert stat.S_IMODE((data / "backups").stat().st_mode) == 0o700
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    log = (data / "controller-1.log").read_text(encoding="utf-8")
    named = [line for line in log.splitlines() if str(backup) in line]
    assert len(named) == 1 and f"revision {OLD}" in named[0], log
    # the backup holds the database as the old release left it
    with tarfile.open(backup) as tar:
        member = tar.extractfile("database.sqlite")
        assert member is not None
        copy = tmp / "in-backup.sqlite"
        copy.write_bytes(member.read())
    assert revision(copy) == OLD
    # and `gpufleet controller restore` takes it into another data directory
    other = tmp / "restored"
    done = cli(["controller", "restore", str(backup), "--data-dir", str(other)], tmp)
    assert (done["from_revision"], done["revision"]) == (OLD, SCHEMA_HEAD)
    with sqlite3.connect(other / "gpufleet.db") as conn:
        nodes = [r[0] for r in conn.execute("SELECT name FROM nodes")]
    assert nodes == [MANIFEST["node"]]


def test_the_api_answers_what_the_old_release_wrote(upgraded: Any) -> None:
    ctl, _ = upgraded
    old, node = MANIFEST["answers"], MANIFEST["node"]

    def get(path: str) -> Any:
        r = ctl.call("GET", path)  # the old release's admin token
        assert r.status_code == 200, (path, r.text)
        return r.json()

    was, now = old[f"/api/v1/nodes/{node}"], get(f"/api/v1/nodes/{node}")
    for key in ("name", "model", "gpus", "rack", "tenant"):
        assert now["node"][key] == was["node"][key], key
    gpu_keys = ("uuid", "model", "pci_bus_id", "driver_version", "memory_total_bytes")
    assert was["devices"] and picked(
        [{**d["info"], "index": d["index"]} for d in now["devices"]], ("index", *gpu_keys)
    ) == picked([{**d["info"], "index": d["index"]} for d in was["devices"]], ("index", *gpu_keys))
    moves = ("id", "from_state", "to_state", "at_s", "actor", "reason")
    kept(now["transitions"], was["transitions"], moves)
    listed = [n["name"] for n in get("/api/v1/nodes")["nodes"]]
    assert listed == [n["name"] for n in old["/api/v1/nodes"]["nodes"]]
    audit_keys = ("id", "action", "actor", "target", "outcome", "at_s")
    kept(get("/api/v1/audit"), old["/api/v1/audit"], audit_keys)
    event_keys = ("id", "kind", "node", "message", "at_s")
    kept(get("/api/v1/events"), old["/api/v1/events"], event_keys)
    finding_keys = ("id", "code", "node", "gpu_index", "severity", "first_seen_s")
    assert picked(get("/api/v1/findings"), finding_keys) == picked(
        old["/api/v1/findings"], finding_keys
    )
    job_keys = ("id", "name", "state", "exit_code", "nodes", "command")
    job = MANIFEST["job"]
    assert picked([get(f"/api/v1/jobs/{job}")], job_keys) == picked(
        [old[f"/api/v1/jobs/{job}"]], job_keys
    )


def push(ctl: ControllerProcess, body: dict[str, Any]) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {MANIFEST['tokens']['agent']}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",  # as the old agent sends it
    }
    raw = gzip.compress(json.dumps(body).encode())
    return httpx.post(ctl.url + "/api/v1/ingest", content=raw, headers=headers, timeout=30)


def test_the_old_agents_batches_are_accepted(upgraded: Any) -> None:
    ctl, _ = upgraded
    for name in MANIFEST["batches"]["stored"]:  # stored by the old controller: acked again
        body = batch_body(name)
        r = push(ctl, body)
        assert r.status_code == 200, r.text
        assert r.json()["seq"] == body["seq"] and r.json()["duplicate"] is True
    (name,) = MANIFEST["batches"]["unstored"]  # never reached the old controller
    body = batch_body(name)
    body = shifted(body, time.time() - body["sent_at_s"])
    r = push(ctl, body)
    assert r.status_code == 200, r.text
    ack = r.json()
    assert (ack["seq"], ack["duplicate"], ack.get("dropped", {})) == (body["seq"], False, {})
    node = ctl.call("GET", f"/api/v1/nodes/{MANIFEST['node']}").json()["node"]
    block = body["samples"][0]
    latest = {g["index"]: g for g in node["gpu_latest"]}[block["gpu_index"]]
    assert latest["t"] == pytest.approx(block["t"][-1])
    assert latest["metrics"]["power_w"] == pytest.approx(block["fields"]["power_w"][-1])


def test_a_newer_agents_batch_is_refused_naming_schema_version(upgraded: Any) -> None:
    ctl, _ = upgraded
    (name,) = MANIFEST["batches"]["unstored"]
    body = batch_body(name)
    body = shifted(body, time.time() - body["sent_at_s"])
    newer = {**body, "schema_version": SCHEMA_VERSION + 1, "seq": body["seq"] + 10}
    newer["a_field_of_the_next_release"] = {"x": 1}
    r = push(ctl, newer)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"schema_version: {SCHEMA_VERSION + 1} is newer"), detail
    assert "upgrade the control plane" in detail


def test_the_agent_logs_the_refusal_clearly(
    upgraded: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """This release's pusher, replaying a spooled batch of a newer schema to the controller,
    logs one error line that says what to do."""
    ctl, _ = upgraded
    (name,) = MANIFEST["batches"]["unstored"]
    body = batch_body(name)
    body = shifted(body, time.time() - body["sent_at_s"])
    seq = body["seq"] + 20
    newer = {**body, "schema_version": SCHEMA_VERSION + 1, "seq": seq}
    state = AgentState(tmp_path / "agent", MANIFEST["node"])
    spool = Spool(tmp_path / "agent" / "spool")
    spool.put(seq, gzip.compress(json.dumps(newer).encode()))
    pusher = Pusher(ctl.url, MANIFEST["tokens"]["agent"], state, spool)
    try:
        with caplog.at_level(logging.ERROR, logger="gpufleet.agent.push"):
            pusher.replay()
    finally:
        pusher.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "gpufleet.agent.push"]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"batch {seq} rejected by the control plane, dropped: HTTP 422")
    assert f"schema_version: {SCHEMA_VERSION + 1} is newer" in lines[0]
    assert "upgrade the control plane before its agents" in lines[0]
    assert pusher.stats.rejected == 1 and len(spool) == 0


def test_no_backup_no_migration(tmp_path: Path) -> None:
    """When the backup cannot be written the migration is refused and nothing changes."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    (data / "backups").write_text("not a directory\n", encoding="utf-8")
    before = (data / "gpufleet.db").read_bytes()
    out = cli_fails(["controller", "migrate", "--data-dir", str(data)], tmp_path)
    assert f"revision {OLD}" in out and "migration refused, nothing was changed" in out, out
    assert "Traceback" not in out
    assert (data / "gpufleet.db").read_bytes() == before


def test_a_newer_database_is_refused_before_any_backup(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    with sqlite3.connect(data / "gpufleet.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    url = database_url(data, None)
    engine = make_engine(url)
    try:
        with pytest.raises(ConfigError, match="9999 is newer than this gpufleet"):
            migrate_with_backup(engine, url, data)
    finally:
        engine.dispose()
    assert not (data / "backups").exists()
    assert revision(data / "gpufleet.db") == "9999"


def cli_fails(args: list[str], home: Path) -> str:
    done = subprocess.run(
        [*GPUFLEET, *args], capture_output=True, text=True, env=env_for(home), timeout=60
    )
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


def test_controller_migrate_prints_its_backup(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    done = cli(["controller", "migrate", "--data-dir", str(data)], tmp_path)
    assert (done["from_revision"], done["revision"]) == (OLD, SCHEMA_HEAD)
    backup = Path(done["backup"])
    assert backup.parent == data / "backups" and backup.is_file()
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    with tarfile.open(backup) as tar:
        assert tar.getnames()[0] == "manifest.json"
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.load(member)
    assert manifest["revision"] == OLD
