"""Jobs start from a clean environment: the agent's secrets (its own token, cloud credentials)
never reach a job process; the allow-list, the scheduler's variables and the job's own env do.
The first test runs a real job process through the local process executor (the agent's job
start path) with a secret-laden agent environment, and reads what the job saw."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.executor import Launch, LocalProcessExecutor
from gpufleet.schedulers.embedded.jobenv import ALLOWED, job_environment


@pytest.mark.process
def test_a_real_job_process_sees_no_agent_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_AGENT_TOKEN", "gf_agent_secret_token_value_1234567890")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LANG", "C.UTF-8")
    ex = LocalProcessExecutor(root=tmp_path / "runs")
    spec = JobSpec(name="env", command=("env",), env={"HF_TOKEN": "job-own"})
    job_env = {"CUDA_VISIBLE_DEVICES": "1", "GPUFLEET_JOB_ID": "j1", "HF_TOKEN": "job-own"}
    ex.start(Launch("j1", 1, "local", (1,), job_env, spec))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(r.running for r in ex.poll("local")):
        time.sleep(0.05)
    log = ex.log_path("j1", 1, "local")
    assert log is not None
    seen = dict(line.split("=", 1) for line in log.read_text().splitlines() if "=" in line)
    assert "GPUFLEET_AGENT_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen
    assert seen["CUDA_VISIBLE_DEVICES"] == "1" and seen["HF_TOKEN"] == "job-own"
    assert seen["LANG"] == "C.UTF-8" and seen["GPUFLEET_JOB_ID"] == "j1"


def test_only_the_allow_list_passes_and_the_job_env_wins() -> None:
    agent = {
        "PATH": "/opt/bin",
        "HOME": "/home/a",
        "GPUFLEET_AGENT_TOKEN": "gf_x",
        "GPUFLEET_TOKEN": "gf_y",
        "HF_TOKEN": "agent-hf",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    env = job_environment({"CUDA_VISIBLE_DEVICES": "2", "HF_TOKEN": "job"}, agent)
    assert env == {
        "PATH": "/opt/bin",
        "HOME": "/home/a",
        "CUDA_VISIBLE_DEVICES": "2",
        "HF_TOKEN": "job",
    }
    assert not any(k.startswith("GPUFLEET_") for k in ALLOWED)
    assert job_environment({}, {})["PATH"]  # a job always has a PATH to find its programs
