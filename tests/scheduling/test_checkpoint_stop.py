"""Checkpoint stops (issue 15, a maintenance drain's deadline) through the real per-copy wrapper:
the job's process gets the signal, and either exits in its grace (``checkpointed``) or is
killed once the grace has run out (``stop_killed``); both copies report as stopped by the agent
(``fenced``: an infrastructure stop, never the job's own failure). The agent-side command
carries the signal and grace from the control plane's executor."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded import Launch, LocalProcessExecutor
from gpufleet.schedulers.embedded.remote import RemoteAgentExecutor
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled
from gpufleet.wire import WireCommand

TRAPS = "trap 'echo saved > ckpt; exit 0' USR1; echo up > started; while :; do sleep 0.05; done"
IGNORES = "trap '' USR1; echo up > started; while :; do sleep 0.05; done"


def _run(tmp_path: Path, script: str, grace_s: float) -> tuple[LocalProcessExecutor, float]:
    ex = LocalProcessExecutor(root=tmp_path / "jobs")
    work = tmp_path / "work"
    work.mkdir()
    spec = JobSpec("j", ("/bin/sh", "-c", script), checkpoint_dir=str(work))
    ex.start(Launch("1", 1, "n1", (0,), {}, spec))
    wait_for(lambda: (work / "started").exists(), 20, "job started")
    t0 = time.monotonic()
    assert ex.signal_stop("1", 1, "n1", "USR1", grace_s) is False  # on its way, not yet gone
    assert ex.signal_stop("1", 1, "n1", "USR1", grace_s) is False  # asked again: a no-op
    wait_for(lambda: not ex.poll("n1")[0].running, 30, "copy ended")
    return ex, time.monotonic() - t0


@pytest.mark.process
def test_a_job_that_traps_the_signal_saves_its_checkpoint(tmp_path: Path) -> None:
    grace = scaled(30.0)
    ex, took = _run(tmp_path, TRAPS, grace_s=grace)
    assert (tmp_path / "work" / "ckpt").read_text().strip() == "saved"
    assert took < grace / 3  # it left in its grace, long before it ran out
    rep = ex.poll("n1")[0]
    assert rep.fenced and rep.exit_code is None
    assert "checkpoint stop: exited" in rep.reason and "exit 0" in rep.reason


@pytest.mark.process
def test_a_job_that_ignores_the_signal_is_killed_after_its_grace(tmp_path: Path) -> None:
    ex, took = _run(tmp_path, IGNORES, grace_s=1.5)
    assert not (tmp_path / "work" / "ckpt").exists()
    assert took >= 1.5  # not before the grace ran out
    rep = ex.poll("n1")[0]
    assert rep.fenced and "checkpoint stop: still running" in rep.reason, rep.reason


def test_the_control_plane_sends_the_signal_with_the_kill(tmp_path: Path) -> None:
    from gpufleet.wire import Batch

    ex = RemoteAgentExecutor(clock=lambda: 100.0)
    body = {
        "schema_version": 1,
        "node": "n1",
        "agent_id": "a",
        "seq": 1,
        "sent_at_s": 100.0,
        "heartbeat_interval_s": 1.0,
        "jobs": {
            "lease_s": 30,
            "copies": [{"job_id": "7", "generation": 2, "running": True}],
        },
    }
    ex.observe(Batch.model_validate(body), 100.0)
    assert ex.signal_stop("7", 2, "n1", "USR1", 45.0) is False
    cmds, _ = ex.observe(Batch.model_validate({**body, "seq": 2}), 100.0)
    assert cmds == [WireCommand(op="kill", job_id="7", generation=2, signal="USR1", grace_s=45.0)]
