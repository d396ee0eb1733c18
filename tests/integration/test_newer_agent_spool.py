"""A newer agent against an older controller (issue 29, "upgrading gpufleet itself"): real
controller and agent processes, the agent one wire schema ahead. The controller refuses every
batch (422 naming ``schema_version``); the agent keeps them in its spool, says so once, shows it
on its ``/metrics``, and once the controller is "upgraded" (restarted speaking the newer
schema) every batch the agent made arrives: seq 1 up to its last, contiguous, none twice.

"Newer" is a test-side stand-in, not a hook in production code: a ``sitecustomize`` module on
the child's ``PYTHONPATH`` makes that interpreter's gpufleet speak wire schema 2
(`SCHEMA_VERSION` and the `Batch` model's ``schema_version`` Literal), before the CLI imports
anything else. The agent runs with it from the start, the upgraded controller with it after the
restart; the first controller is this release's code as it is.

On the old code the agent dropped every refused batch (422 was a permanent refusal), so the
first controller's batches never arrived: the test fails there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.procs import PYTHON, ControllerProcess, child_env, create_tokens
from gpufleet.testing.testbed import free_port
from gpufleet.testing.timescale import scaled
from tests.waiting import wait_truthy

pytestmark = pytest.mark.process

NEWER = 2  # the newer agent's wire schema (this release speaks 1)
PUSH_S = 0.2  # the agent's push interval: its retry cap while refused is 12 x this (2.4 s)
KEPT = 5  # batches in the spool before the controller is upgraded

SHIM = f'''"""Test stand-in: this interpreter's gpufleet speaks wire schema {NEWER}."""
import sys
from typing import Literal

import gpufleet.wire
import gpufleet.wire.batch
import gpufleet.wire.limits

OLD = gpufleet.wire.batch.Batch


class Batch(OLD):
    schema_version: Literal[1, {NEWER}] = {NEWER}


gpufleet.wire.limits.SCHEMA_VERSION = {NEWER}
for mod in list(sys.modules.values()):  # the modules that took the names at their import
    if getattr(mod, "__name__", "").startswith("gpufleet"):
        if getattr(mod, "SCHEMA_VERSION", None) == 1:
            mod.SCHEMA_VERSION = {NEWER}
        if getattr(mod, "Batch", None) is OLD:
            mod.Batch = Batch
'''


def newer_env(tmp: Path) -> dict[str, str]:
    """The children's environment with the schema-2 ``sitecustomize`` first on the path."""
    shim = tmp / "newer-schema"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM, encoding="utf-8")
    env = child_env()
    env.pop("GPUFLEET_AGENT_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    return env


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of ``name``'s sample carrying ``labels`` (among others) in an exposition."""
    for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if labels.items() <= have.items():
            return float(m.group(2))
    return None


class NewerAgent:
    """``gpufleet agent --sim 1x1xh100-sxm`` speaking schema 2, its ``/metrics`` on a port."""

    def __init__(self, tmp: Path, url: str, token: str) -> None:
        self.port = free_port()
        self.state = tmp / "agent"
        token_file = tmp / "agent.token"
        token_file.write_text(token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        self.log = tmp / "agent.log"
        args = ["agent", "--sim", "1x1xh100-sxm", "--controller", url]
        args += ["--token-file", str(token_file), "--state-dir", str(self.state)]
        args += ["--listen", f"127.0.0.1:{self.port}", "--push-interval", f"{PUSH_S:g}"]
        args += ["--fast-interval", f"{PUSH_S:g}", "--log-level", "warning"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "gpufleet", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=newer_env(tmp),
            )

    def metrics(self) -> str:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-2000:]
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return ""  # not listening yet

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(scaled(20))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text(errors="replace")


def spooled(text: str) -> float:
    return metric(text, "gpufleet_agent_buffer_depth", buffer="spool") or 0


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, str]:
    return create_tokens(tmp_path / "data", {"admin": ("admin", None), "agent": ("agent", None)})


@pytest.fixture
def procs() -> Iterator[list[ControllerProcess | NewerAgent]]:
    started: list[ControllerProcess | NewerAgent] = []
    yield started
    for p in reversed(started):
        p.stop()


def test_a_newer_agent_keeps_its_batches_until_the_controller_is_upgraded(
    tmp_path: Path, tokens: dict[str, str], procs: list[ControllerProcess | NewerAgent]
) -> None:
    data = tmp_path / "data"
    old = ControllerProcess(data, tokens["admin"], scheduler="none")
    procs.append(old)
    agent = NewerAgent(tmp_path, old.url, tokens["agent"])  # starts beside the controller
    procs.append(agent)
    old.start()

    def kept() -> str:
        text = agent.metrics()
        refused = metric(text, "gpufleet_agent_push_schema_refused_total") or 0
        return text if refused >= 2 and spooled(text) >= KEPT else ""

    # refused twice: the first send and a retry of the spool (kept, not dropped)
    text = wait_truthy(kept, 30, f"{KEPT} batches kept, refused twice")
    assert metric(text, "gpufleet_agent_control_plane_older") == 1
    assert metric(text, "gpufleet_agent_push_rejected_total") == 0  # none dropped
    assert metric(text, "gpufleet_agent_spool_dropped_total") == 0

    old.stop()  # the upgrade: the same database and port, the newer schema
    upgraded = ControllerProcess(
        data, tokens["admin"], port=old.port, scheduler="none", env=newer_env(tmp_path)
    )
    procs.append(upgraded)
    upgraded.start()

    def delivered() -> str:
        text = agent.metrics()
        older = metric(text, "gpufleet_agent_control_plane_older")
        return text if older == 0 and spooled(text) == 0 else ""

    # the kept batches wait out a retry of at most 12 push intervals, then go in one replay
    wait_truthy(delivered, 30, "the kept batches delivered to the upgraded controller")
    log = agent.stop()
    summary = upgraded.call("GET", "/api/v1/summary").json()["ingest"]
    upgraded.stop()

    next_seq = int(json.loads((agent.state / "agent.json").read_text())["next_seq"])
    with sqlite3.connect(data / "gpufleet.db") as db:
        rows = db.execute("SELECT seq FROM ingested_batches ORDER BY seq").fetchall()
    seqs = [r[0] for r in rows]
    assert seqs == list(range(1, next_seq)), (seqs, next_seq)  # every one, contiguous
    assert summary["duplicates"] == 0 and summary["batches"] == len(seqs), summary
    refusal = [ln for ln in log.splitlines() if "speaks wire schema" in ln]
    assert len(refusal) == 1, log[-3000:]  # one line, not one per batch
    assert f"wire schema 1, this agent {NEWER}: upgrade the control plane" in refusal[0]
    assert "Traceback" not in log
