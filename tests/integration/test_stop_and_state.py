"""SIGTERM (what systemd, Docker and Kubernetes send) stops the controller, `gpufleet up` and the
agent as cleanly as Ctrl-C: the controller writes its rollups, the agent pushes or spools what it
sampled. Afterwards every state directory they made is 0700 and every state file 0600 (database
with its WAL, agent state, spool, job logs)."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import time
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.testbed import free_port, wait_for
from tests.control.conftest import batch
from tests.integration.processes import cli, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.process]


def loose_modes(root: Path) -> list[str]:
    """Every directory under ``root`` (itself included) not 0700 and file not 0600 or 0700."""
    bad = []
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        if p.is_symlink():
            continue
        if (p.is_dir() and mode != 0o700) or (not p.is_dir() and mode & 0o077):
            bad.append(f"{p.relative_to(root.parent)} {mode:o}")
    return bad


def rollups(data: Path) -> int:
    with sqlite3.connect(data / "gpufleet.db") as db:
        return int(db.execute("SELECT count(*) FROM rollups").fetchone()[0])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_controller_stopped_by_a_signal_writes_its_rollups(tmp_path: Path, sig: int) -> None:
    data = tmp_path / "data"
    token = cli(["token", "create", "--role", "agent", "--data-dir", str(data)], tmp_path)["token"]
    port = free_port()
    proc, info = start(
        [
            "controller",
            "--data-dir",
            str(data),
            "--port",
            str(port),
            "--scheduler",
            "none",
            "--json",
        ],
        tmp_path,
    )
    headers = {"Authorization": f"Bearer {token}"}
    now = time.time()
    for seq in range(1, 5):
        # in a minute still open until the stop (closed minutes are written within 2 s)
        body = batch("n1", seq, gpus=2, k=5, t=now + 120 + 10 * seq)
        r = httpx.post(f"{info['url']}/api/v1/ingest", json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
    assert rollups(data) == 0  # nothing flushed yet: the first flush is at the stop
    err = stop(proc, sig)
    assert proc.returncode in (0, -sig, 128 + sig), err
    assert rollups(data) > 0, err
    assert loose_modes(data) == []


def test_agent_spools_what_it_sampled_when_stopped_by_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: the last push is spooled
    proc, _ = start(
        [
            "agent",
            "--sim",
            "1x2xh100-sxm",
            "--controller",
            dead,
            "--token",
            "gf_" + "x" * 43,
            "--state-dir",
            str(state),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--fast-interval",
            "0.2",
            "--push-interval",
            "600",
            "--json",
        ],
        tmp_path,
    )
    time.sleep(1.5)  # a few samples, no push yet
    assert not list((state / "spool").glob("*.json.gz"))
    err = stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert list((state / "spool").glob("*.json.gz")), err
    assert (state / "agent.json").exists()
    assert loose_modes(state) == []


def test_up_stopped_by_sigterm_writes_rollups_and_keeps_state_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    proc, info = start(
        ["up", "--sim", "2x2xh100-sxm", "--data-dir", str(data), "--port", str(port), "--json"],
        tmp_path,
    )
    client = httpx.Client(
        base_url=f"{info['url']}/api/v1",
        headers={"Authorization": f"Bearer {info['admin_token']}"},
        timeout=10,
    )
    wait_for(lambda: len(client.get("/nodes").json()["nodes"]) == 2, 60, "both nodes pushed")
    client.close()
    signalled = time.time()
    err = stop(proc, signal.SIGTERM)
    assert proc.returncode in (0, 128 + signal.SIGTERM), err
    assert rollups(data) > 0, err
    with sqlite3.connect(data / "gpufleet.db") as db:
        last = db.execute("SELECT node, max(received_s) FROM ingested_batches GROUP BY node")
        after = {node for node, t in last if t >= signalled}
    # each agent pushed its last samples after the signal, while the server still answered
    assert after == {"sim-00", "sim-01"}, err
    assert os.listdir(data / "agents")
    assert loose_modes(data) == []
