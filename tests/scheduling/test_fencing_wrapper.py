"""The per-copy wrapper's fence (issue 12, item 1), with real processes and no controller.

A copy's grandchild (the heartbeat loop a shell starts) must die when its agent dies (``kill -9``
of the process holding the executor), when the agent's lease file goes stale, and when the copy's
command ends leaving it behind, even after it escaped into its own session. The latency bounds
are the issue's: dead within the lease plus a margin (the wrapper's SIGTERM grace and its check
step), measured from the kill or from the last renewal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.embedded import (
    EmbeddedScheduler,
    JobStore,
    Launch,
    LocalProcessExecutor,
    NodeInfo,
)
from gpufleet.schedulers.embedded.placement import GpuSlot
from gpufleet.schedulers.embedded.runner import TERM_GRACE_S
from gpufleet.testing.procs import heartbeat_job, processes_with, read_beats
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled

pytestmark = [pytest.mark.slow, pytest.mark.process]
MARGIN_S = TERM_GRACE_S + 2.0  # the wrapper's TERM grace, its check step, a loaded machine


def _launch(job_id: str, command: list[str], gen: int = 1) -> Launch:
    return Launch(
        job_id, gen, "n1", (0,), {"GPUFLEET_GENERATION": str(gen)}, JobSpec("j", tuple(command))
    )


def _src() -> str:
    return str(Path(__file__).resolve().parents[2] / "src")


def test_agent_kill_9_takes_the_copys_grandchild_down(tmp_path: Path) -> None:
    beats = tmp_path / "beats"
    agent_code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from gpufleet.schedulers.base import JobSpec
        from gpufleet.schedulers.embedded import Launch, LocalProcessExecutor
        ex = LocalProcessExecutor(root=Path({str(tmp_path / "jobs")!r}), lease_s=60, fenced=True)
        cmd = {heartbeat_job(beats, 100000)!r}
        env = {{"GPUFLEET_GENERATION": "1"}}
        ex.start(Launch("1", 1, "n1", (0,), env, JobSpec("j", tuple(cmd))))
        print("started", flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": _src()}
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_code], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "started"
        wait_for(lambda: 1 in read_beats(beats).runs, 20, "heartbeats")
        assert processes_with(str(beats)), "the heartbeat grandchild runs"
        killed_at = time.monotonic()
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not processes_with(str(beats)), MARGIN_S, "grandchild dead")
        took = time.monotonic() - killed_at
        assert took < scaled(MARGIN_S)
        size = beats.stat().st_size
        time.sleep(0.5)
        assert beats.stat().st_size == size, "no heartbeat after the fence"
    finally:
        if agent.poll() is None:
            agent.kill()
    # a later agent (a restarted one) learns the copy was fenced, not that the job failed
    rep = LocalProcessExecutor(root=tmp_path / "jobs").poll("n1")
    assert len(rep) == 1 and not rep[0].running
    assert rep[0].fenced and rep[0].exit_code is None
    assert "agent died" in rep[0].reason


def test_stale_lease_file_fences_and_renewal_keeps_the_copy(tmp_path: Path) -> None:
    lease_s = 1.5
    ex = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=lease_s, fenced=True)
    beats = tmp_path / "beats"
    ex.start(_launch("1", heartbeat_job(beats, 100000)))
    wait_for(lambda: beats.exists(), 20, "heartbeats")
    until = time.monotonic() + 2 * lease_s
    while time.monotonic() < until:  # contact keeps coming: the copy lives past its lease
        ex.renew_lease()
        time.sleep(0.1)
    assert processes_with(str(beats)), "renewed lease: the grandchild still runs"
    ex.renew_lease()
    renewed = time.monotonic()
    wait_for(lambda: not processes_with(str(beats)), lease_s + MARGIN_S, "grandchild dead")
    took = time.monotonic() - renewed
    assert lease_s <= took + 0.2, f"fenced {took:.2f} s after the last renewal: before its lease"
    wait_for(lambda: not ex.poll("n1")[0].running, 10, "wrapper ended")
    [rep] = ex.poll("n1")
    assert rep.fenced and rep.exit_code is None and "no contact" in rep.reason


def test_leftovers_that_escaped_their_session_die_with_the_copy(tmp_path: Path) -> None:
    marker = f"fence-escape-{os.getpid()}-{time.monotonic_ns()}"
    # the command double-forks a loop into its own session and exits 0 at once
    script = f"setsid sh -c 'while :; do sleep 0.1; done; : {marker}' & exit 0"
    ex = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=60, fenced=True)
    ex.start(_launch("2", ["sh", "-c", script]))
    wait_for(lambda: not ex.poll("n1")[0].running, 20, "copy ended")
    [rep] = ex.poll("n1")
    assert rep.exit_code == 0 and not rep.fenced
    assert not processes_with(marker), "the escaped loop outlived its copy"


def test_own_exit_status_is_not_a_fence(tmp_path: Path) -> None:
    ex = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=60, fenced=True)
    ex.start(_launch("3", ["sh", "-c", "exit 3"]))
    wait_for(lambda: not ex.poll("n1")[0].running, 20, "copy ended")
    [rep] = ex.poll("n1")
    assert rep.exit_code == 3 and not rep.fenced and rep.reason == "exit 3"


def test_a_copy_the_agent_killed_is_reported_fenced(tmp_path: Path) -> None:
    ex = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=60, fenced=True, kill_grace_s=5)
    beats = tmp_path / "beats"
    ex.start(_launch("4", heartbeat_job(beats, 100000)))
    wait_for(lambda: beats.exists(), 20, "heartbeats")
    assert ex.kill("4", 1, "n1")
    assert not processes_with(str(beats))
    [rep] = ex.poll("n1")
    assert rep.fenced and rep.exit_code is None and "killed" in rep.reason


def test_a_fenced_copy_is_requeued_never_failed_and_uses_no_restart(tmp_path: Path) -> None:
    """Issue 12, item 2: the copy its lease killed (exit 143 before) is requeued on the same
    node, its restarts untouched, and the next copy runs to the end."""
    lease_s = 1.0
    ex = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=lease_s, fenced=True)
    node = NodeInfo("n1", (GpuSlot(0, "h100-sxm", 80 * 2**30),))
    eng = EmbeddedScheduler(JobStore.open(tmp_path / "s.db"), ex, [node])
    beats = tmp_path / "beats"
    # 8 s of beats: the fence (lease 1 s + the wrapper's step) must come first even on a loaded
    # machine; with 1 s of beats the first copy once finished before it ("1 done" in the beats)
    job_id = eng.submit(JobSpec("j", tuple(heartbeat_job(beats, 80)), max_restarts=0))
    eng.tick()
    assert eng.job(job_id).state is JobState.RUNNING
    # nobody renews the lease (the agent lost the control plane): the wrapper fences the copy
    wait_for(lambda: not ex.poll("n1")[0].running, lease_s + MARGIN_S + 5, "copy fenced")
    ex.renew_lease()  # contact again
    eng.tick()  # requeued, and placed again at once: the kill is confirmed
    job = eng.job(job_id)
    assert job.state is JobState.RUNNING and job.generation == 2 and job.restarts == 0, job
    assert job.excluded == ()
    [first, _second] = eng.attempts(job_id)
    assert first.outcome.startswith("requeued") and "fenced" in first.outcome, first

    def finished() -> bool:
        ex.renew_lease()  # contact again: the next copy keeps its lease
        eng.tick()
        return eng.job(job_id).state.final

    wait_for(finished, 60, "job finished", step_s=0.1)
    job = eng.job(job_id)
    assert job.state is JobState.SUCCEEDED and job.restarts == 0 and job.generation == 2
    assert read_beats(beats).done == (2,)
