"""The agent's side of the jobs exchange (issue 12): an agent that runs jobs pushes at least every
`DEFAULT_EXCHANGE_S` whatever its push interval, and reports at once when an Ack's command
started or stopped a copy (a repeated command that changes nothing does not)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufleet.agent.jobs import DEFAULT_EXCHANGE_S, AgentJobs
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded import LocalProcessExecutor
from gpufleet.wire import Ack, WireCommand

pytestmark = pytest.mark.process


def test_jobs_agent_exchanges_every_second_and_reports_changes_at_once(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000.0)
    fleet = SimFleet(parse_fleet_spec("1x2xh100"), clock=clock)
    cfg = AgentConfig(
        controller="http://127.0.0.1:9", token="t", state_dir=tmp_path, push_interval_s=5.0
    )
    agent = Agent(fleet.node("sim-00").backend(), cfg, clock=clock)
    assert agent.push_every_s() == 5.0  # no jobs: the push interval
    executor = LocalProcessExecutor(root=tmp_path / "jobs")
    agent.enable_jobs(AgentJobs("sim-00", executor, slots=()))
    assert agent.push_every_s() == DEFAULT_EXCHANGE_S == 1.0
    spec = JobSpec("s", command=(sys.executable, "-c", "import time; time.sleep(30)"))
    start = WireCommand(op="start", job_id="7", generation=1, gpus=[0], spec=spec)
    kill = WireCommand(op="kill", job_id="7", generation=1)
    assert agent.pusher is not None and agent.pusher.on_ack is not None
    try:
        agent.pusher.on_ack(Ack(agent_id="a", seq=1, commands=[start]))
        assert agent.push_soon.is_set()  # a copy started: report it now
        agent.push_soon.clear()
        agent.pusher.on_ack(Ack(agent_id="a", seq=2, commands=[start]))  # a repeat
        agent.pusher.on_ack(Ack(agent_id="a", seq=3))
        assert not agent.push_soon.is_set()
        agent.pusher.on_ack(Ack(agent_id="a", seq=4, commands=[kill]))
        assert agent.push_soon.is_set()  # the copy stopped
        assert not any(r.running for r in executor.poll("sim-00"))
    finally:
        executor.kill("7", 1, "sim-00")
        agent.close()
