"""LocalProcessExecutor with real processes, the failover drill, and `gpufleet jobs`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.embedded import (
    EmbeddedScheduler,
    JobStore,
    LocalProcessExecutor,
    NodeInfo,
)
from gpufleet.schedulers.embedded.drill import run_drill
from gpufleet.schedulers.embedded.placement import GpuSlot
from gpufleet.testing.timescale import scaled
from gpufleet.wire.views import JobDetail

PRINT_ENV = (
    "import os; print('cvd=' + os.environ['CUDA_VISIBLE_DEVICES']); "
    "print('restart=' + os.environ['GPUFLEET_RESTART_COUNT'])"
)


def local(tmp_path: Path) -> EmbeddedScheduler:
    node = NodeInfo("here", tuple(GpuSlot(i, "h100-sxm", 80 * 2**30) for i in range(4)))
    store = JobStore.open(tmp_path / "s.db")
    return EmbeddedScheduler(store, LocalProcessExecutor(root=tmp_path / "runs"), [node])


def wait_final(eng: EmbeddedScheduler, job_id: str, limit_s: float = 20.0) -> JobState:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        eng.tick()
        state = eng.job(job_id).state
        if state.final:
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {eng.job(job_id).state} after {limit_s} s")


@pytest.mark.process
def test_real_process_gets_its_gpus_and_log(tmp_path: Path) -> None:
    eng = local(tmp_path)
    eng.submit(
        JobSpec("first", gpus=1, command=(sys.executable, "-c", "import time; time.sleep(5)"))
    )
    jid = eng.submit(JobSpec("env", gpus=2, command=(sys.executable, "-c", PRINT_ENV)))
    assert wait_final(eng, jid) is JobState.SUCCEEDED
    log = eng.log_path(jid)
    assert log is not None
    # The first job holds GPU 0, so this one gets the next two: "1,2".
    assert log.read_text().splitlines() == ["cvd=1,2", "restart=0"]
    assert eng.job(jid).exit_code == 0


@pytest.mark.process
def test_exit_code_and_stderr_captured(tmp_path: Path) -> None:
    """A job that always exits non-zero is restarted max_restarts times, then fails."""
    eng = local(tmp_path)
    code = "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"
    jid = eng.submit(JobSpec("bad", gpus=1, max_restarts=2, command=(sys.executable, "-c", code)))
    assert wait_final(eng, jid, limit_s=60) is JobState.FAILED  # three copies, one at a time
    job = eng.job(jid)
    assert job.exit_code == 3 and (job.restarts, job.requeues) == (2, 0)
    assert "max_restarts=2" in job.reason
    assert len(eng.attempts(jid)) == 3  # the first copy and two restarts
    assert "boom" in eng.log_path(jid).read_text()  # type: ignore[union-attr]


@pytest.mark.process
def test_own_failure_restarts_then_succeeds(tmp_path: Path) -> None:
    """Restarts are on by default (max_restarts 3): a job that fails once and then succeeds
    ends succeeded, with one restart and no requeue; the second copy sees the count."""
    eng = local(tmp_path)
    marker = tmp_path / "failed-once"
    code = (
        "import os, sys, pathlib; m = pathlib.Path(sys.argv[1]); "
        "print('count', os.environ['GPUFLEET_RESTART_COUNT']); "
        "sys.exit(0 if m.exists() else (m.write_text('x') and 7))"
    )
    spec = JobSpec("flaky", gpus=1, command=(sys.executable, "-c", code, str(marker)))
    assert spec.max_restarts == 3 and spec.max_requeues == 10
    jid = eng.submit(spec)
    assert wait_final(eng, jid, limit_s=40) is JobState.SUCCEEDED
    job = eng.job(jid)
    assert (job.restarts, job.requeues) == (1, 0)
    assert [a.outcome for a in eng.attempts(jid)] == ["requeued: exit 7", "exit 0"]
    assert "count 1" in eng.log_path(jid).read_text()  # type: ignore[union-attr]


@pytest.mark.process
def test_cancel_kills_the_process(tmp_path: Path) -> None:
    eng = local(tmp_path)
    marker = tmp_path / "still-alive"
    code = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('x')"
    jid = eng.submit(JobSpec("sleepy", gpus=1, command=(sys.executable, "-c", code)))
    eng.tick()
    assert eng.job(jid).state is JobState.RUNNING
    eng.cancel(jid)
    assert eng.job(jid).state is JobState.CANCELLED
    time.sleep(3.5)
    assert not marker.exists()


@pytest.mark.process
def test_new_executor_instance_learns_how_a_copy_ended(tmp_path: Path) -> None:
    eng = local(tmp_path)
    jid = eng.submit(JobSpec("q", gpus=1, command=(sys.executable, "-c", "print('hi')")))
    eng.tick()
    eng.store.close()
    time.sleep(0.5)
    eng2 = local(tmp_path)  # a new scheduler and executor: only the files remain
    assert wait_final(eng2, jid) is JobState.SUCCEEDED


def test_failover_drill_under_ten_seconds() -> None:
    r = run_drill(agent_poll_s=1.0, tick_s=1.0, fault_offset_s=0.35)
    assert r.second_node != r.first_node
    # Fault at 0.35 s past a whole second; the agent polls at the next whole second (0.65 s
    # later) and the scheduler ticks at the same instant: 0.65 s of simulated time.
    assert abs(r.detected_after_s - 0.65) < 1e-6
    assert abs(r.sim_failover_s - 0.65) < 1e-6
    assert r.sim_failover_s + r.wall_failover_s < scaled(10.0)
    assert r.requeue_count == 1 and r.restart_count == 0 and r.env_restart_count == "1"
    assert r.checkpoint_dir == "/ckpt/train"


@pytest.mark.process
def test_cli_submit_list_show_logs_cancel(tmp_path: Path) -> None:
    runner = CliRunner()
    sd = ["--state-dir", str(tmp_path / "st")]
    res = runner.invoke(
        app,
        [
            "jobs",
            "submit",
            *sd,
            "--sim",
            "1x2xh100",
            "--gpus",
            "2",
            "--json",
            "--name",
            "hello",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
        ],
    )
    assert res.exit_code == 0, res.output
    job = json.loads(res.output)
    assert job["state"] == "running" and job["gpus"] == [0, 1]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        res = runner.invoke(app, ["jobs", "list", *sd, "--json"])
        if json.loads(res.output)[0]["state"] == "succeeded":
            break
        time.sleep(0.1)
    assert json.loads(res.output)[0]["state"] == "succeeded"
    res = runner.invoke(app, ["jobs", "logs", job["id"], *sd])
    assert res.output == "0,1\n"
    res = runner.invoke(app, ["jobs", "show", job["id"], *sd, "--json"])
    shown = json.loads(res.output)
    # the document GET /api/v1/jobs/{id} answers, read from the local state (one shape)
    assert set(shown) == set(JobDetail.model_fields)
    assert shown["exit_code"] == 0 and len(shown["attempts"]) == 1
    assert shown["attempts"][0]["outcome"] == "exit 0" and shown["log"]
    res = runner.invoke(
        app, ["jobs", "submit", *sd, "--", sys.executable, "-c", "import time; time.sleep(30)"]
    )
    assert res.exit_code == 0 and "running" in res.output
    res = runner.invoke(app, ["jobs", "cancel", "2", *sd, "--json"])
    assert json.loads(res.output)["state"] == "cancelled"
    res = runner.invoke(app, ["jobs", "list", *sd, "--controller", "http://127.0.0.1:1"])
    assert "--controller needs --token" in str(res.exception)  # wired since issue 7


def test_cli_rejects_impossible_job(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "jobs",
            "submit",
            "--state-dir",
            str(tmp_path),
            "--sim",
            "1x2xh100",
            "--gpus",
            "3",
            "--",
            "true",
        ],
    )
    assert res.exit_code != 0
    assert "only 0 of 1 node" in str(res.exception)


@pytest.mark.process
def test_cli_restart_budgets_default_on_and_shown(tmp_path: Path) -> None:
    """`jobs submit` restarts by default (3 own failures, 10 infrastructure requeues); both
    budgets are in --help, in the stored spec and in `jobs show`/`jobs list`."""
    runner = CliRunner()
    help_text = runner.invoke(app, ["jobs", "submit", "--help"], terminal_width=200).output
    assert "--max-restarts" in help_text and "--max-requeues" in help_text
    sd = ["--state-dir", str(tmp_path / "st")]
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    res = runner.invoke(app, ["jobs", "submit", *sd, "--sim", "1x2xh100", "--json", "--", *sleeper])
    assert res.exit_code == 0, res.output
    job = json.loads(res.output)
    assert (job["spec"]["max_restarts"], job["spec"]["max_requeues"]) == (3, 10)
    res = runner.invoke(app, ["jobs", "submit", *sd, "--json", "--max-requeues", "2", "--", "true"])
    assert json.loads(res.output)["spec"]["max_requeues"] == 2
    res = runner.invoke(app, ["jobs", "show", job["id"], *sd], terminal_width=200)
    assert "restarts: 0/3 (own exits); requeues: 0/10 (infrastructure)" in res.output
    res = runner.invoke(app, ["jobs", "list", *sd, "--json"])
    assert [(j["restarts"], j["requeues"]) for j in json.loads(res.output)] == [(0, 0), (0, 0)]
    res = runner.invoke(app, ["jobs", "submit", *sd, "--max-requeues", "-1", "--", "true"])
    assert res.exit_code != 0 and "--max-requeues" in res.output
    runner.invoke(app, ["jobs", "cancel", job["id"], *sd])


@pytest.mark.process
def test_cli_list_needs_no_gpu_and_keeps_state_private(tmp_path: Path) -> None:
    """`jobs list --state-dir NEW` on a machine without a GPU used to say "pass --sim", an
    option `jobs list` does not have; listing needs no GPU (issue 17)."""
    runner = CliRunner()
    sd = ["--state-dir", str(tmp_path / "st")]
    res = runner.invoke(app, ["jobs", "list", *sd, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == []
    res = runner.invoke(
        app,
        ["jobs", "submit", *sd, "--sim", "1x2xh100", "--gpus", "2", "--", "sleep", "30"],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["jobs", "list", *sd], env={"COLUMNS": "200"})
    row = next(ln for ln in res.output.splitlines() if "sleep" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    # "gpus" is what the job asks for, as with --controller; "on gpus" the indices
    assert cells[5:7] == ["2", "0,1"], cells
    runner.invoke(app, ["jobs", "cancel", "1", *sd])
    st = tmp_path / "st"
    assert st.stat().st_mode & 0o777 == 0o700
    for name in ("lock", "sched.db"):
        assert (st / name).stat().st_mode & 0o777 == 0o600, name
    assert (st / "runs").stat().st_mode & 0o777 == 0o700
