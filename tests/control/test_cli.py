"""The commands: `gpufleet controller migrate`, `gpufleet token create|list|revoke`, and
`gpufleet up` end to end (a real process: URL and admin token printed, the simulated fleet
registered through ingest, Ctrl-C stops it cleanly)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.db.engine import head_revision
from gpufleet.control.service import ControlService
from gpufleet.errors import UsageError
from tests.control.conftest import free_port, wait_for

runner = CliRunner()


def test_migrate_and_tokens(tmp_path: Path) -> None:
    d = str(tmp_path / "d")
    r = runner.invoke(app, ["controller", "migrate", "--data-dir", d, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["revision"] == head_revision()
    r = runner.invoke(
        app, ["token", "create", "--role", "operator", "--tenant", "t1", "--data-dir", d, "--json"]
    )
    assert r.exit_code == 0, r.output
    made = json.loads(r.output)
    assert made["token"].startswith("gf_") and made["tenant"] == "t1"
    r = runner.invoke(
        app, ["token", "create", "--role", "agent", "--node", "gpu-01", "--data-dir", d, "--json"]
    )
    assert json.loads(r.output)["node"] == "gpu-01"
    r = runner.invoke(app, ["token", "create", "--role", "viewer", "--node", "x", "--data-dir", d])
    assert isinstance(r.exception, UsageError) and "--role agent" in str(r.exception)
    # --node alone makes an agent token, as its help says; no --role and no --node is an error
    r = runner.invoke(app, ["token", "create", "--node", "gpu-02", "--data-dir", d, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["role"] == "agent" and json.loads(r.output)["node"] == "gpu-02"
    r = runner.invoke(app, ["token", "create", "--data-dir", d])
    assert isinstance(r.exception, UsageError) and "--role" in str(r.exception)
    r = runner.invoke(app, ["token", "list", "--data-dir", d, "--json"])
    listed = json.loads(r.output)
    assert [t["role"] for t in listed] == ["operator", "agent", "agent"]
    assert made["token"] not in r.output  # only prefixes are listed
    r = runner.invoke(app, ["token", "revoke", str(made["id"]), "--data-dir", d, "--json"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["token", "list", "--data-dir", d, "--json"])
    assert json.loads(r.output)[0]["revoked_s"] is not None
    r = runner.invoke(app, ["token", "revoke", "999", "--data-dir", d])
    assert isinstance(r.exception, UsageError) and "999" in str(r.exception)


@pytest.mark.slow
@pytest.mark.process
def test_up_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "HOME": str(tmp_path)}  # a fresh machine: default data dir under HOME
    fleet = tmp_path / "fleet.yaml"  # two nodes in rack "east", one with no rack given
    fleet.write_text(
        "nodes:\n  - {name: e, model: h100-sxm, gpus: 4, count: 2, rack: east}\n"
        "  - {name: w, model: h100-sxm, gpus: 4}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "up", "--sim", str(fleet), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    token = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and token is None:
        line = proc.stdout.readline()
        lines.append(line)
        m = re.search(r"admin token: (gf_\S+)", line)
        token = m.group(1) if m else None
    try:
        assert token, "".join(lines)
        assert any(f"http://127.0.0.1:{port}/#token=" in x for x in lines)
        h = {"Authorization": f"Bearer {token}"}
        base = f"http://127.0.0.1:{port}/api/v1"

        def all_in_service() -> bool:
            s = httpx.get(f"{base}/summary", headers=h, timeout=5).json()
            return bool(s["by_state"]["in_service"] == 3 and s["gpus"] == 12)

        assert wait_for(all_in_service, timeout=30)
        nodes = httpx.get(f"{base}/nodes", headers=h, timeout=5).json()["nodes"]
        assert all(g["metrics"]["power_w"] is not None for n in nodes for g in n["gpu_latest"])

        def racks() -> dict[str, str | None]:
            listed = httpx.get(f"{base}/nodes", headers=h, timeout=5).json()["nodes"]
            return {n["name"]: n["rack"] for n in listed}

        # the fleet file's rack: is kept (it used to become r00 for every node)
        want = {"e-00": "east", "e-01": "east", "w": "r00"}
        assert wait_for(lambda: racks() == want, timeout=20), racks()
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
        assert (tmp_path / ".local/share/gpufleet/gpufleet.db").exists()
        token_file = tmp_path / ".local/share/gpufleet/admin.token"
        assert token_file.read_text().strip() == token
        assert token_file.stat().st_mode & 0o777 == 0o600
        # the agents push with node-bound tokens, so their nodes offer job slots: a job runs
        body = {"name": "t", "command": ["sim"], "duration_s": 0.5}
        jid = httpx.post(f"{base}/jobs", headers=h, json=body, timeout=5).json()["id"]

        def job_done() -> bool:
            j = httpx.get(f"{base}/jobs/{jid}", headers=h, timeout=5).json()
            return bool(j["state"] == "succeeded")

        assert wait_for(job_done, timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    rest = proc.stdout.read()
    assert rc == 0, rest
    assert "Traceback" not in rest
    # the nodes went validating -> in_service on their own (their agents ran level 1), and
    # `up` said so as it happened
    printed = "".join(lines) + rest
    for node in ("e-00", "e-01", "w"):
        assert f"{node}: new -> validating" in printed, printed
        assert re.search(
            rf"{node}: validating -> in_service \(validation result: (pass|warn) \(level 1 by",
            printed,
        ), printed


@pytest.mark.process
def test_up_rejects_a_bad_policy_file_naming_the_field(tmp_path: Path) -> None:
    import subprocess
    import sys

    policy = tmp_path / "policy.yaml"
    policy.write_text("min_out_nodez: 2\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "up",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "1",
            "--policy",
            str(policy),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "min_out_nodez" in proc.stderr and "Traceback" not in proc.stderr


def test_up_revokes_the_tokens_of_its_earlier_runs(
    make_service: Callable[..., ControlService],
) -> None:
    """`up` revokes the tokens it made (marked as its own), never an admin's token whose name
    merely starts with ``up-`` (the bug: every ``up-*`` token was revoked)."""
    from gpufleet.control.up import admin_token, node_agent_tokens

    svc = make_service()
    kept, _ = svc.store.tokens.create("operator", name="alice")
    lookalike, _ = svc.store.tokens.create("admin", name="up-ops-team")
    first = admin_token(svc)
    agents = node_agent_tokens(svc, ["n1", "n2"])
    second = admin_token(svc)
    rows = {r.name: r for r in svc.store.tokens.list()}
    assert rows["alice"].revoked_s is None
    assert rows["up-ops-team"].revoked_s is None and rows["up-ops-team"].owner is None
    assert svc.store.tokens.resolve(lookalike) is not None
    for node, tok in agents.items():
        row = rows[f"up-agent-{node}"]
        assert (row.node, row.owner, row.revoked_s is not None) == (node, "up", True)
        assert svc.store.tokens.resolve(tok) is None
    assert svc.store.tokens.resolve(first) is None
    who = svc.store.tokens.resolve(second)
    assert who is not None and who.role.value == "admin" and who.tenant is None
    assert first != second and kept not in (first, second)
