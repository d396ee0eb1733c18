"""The agent reports its host's readiness (issue 17: "the agent runs the same checks at start
and reports them as findings"): every batch carries them and the node's health counts them."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.cli.agent import _readiness
from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.health.types import Finding, Severity


def test_host_findings_ride_every_batch_and_set_the_health(tmp_path: Path) -> None:
    backend = SimFleet(parse_fleet_spec("1x2xh100-sxm")).backends()[0]
    found = Finding(
        rule="readiness",
        code="READINESS_DRIVER_NOUVEAU",
        severity=Severity.FAIL,
        component="node",
        message="nouveau is loaded",
    )
    cfg = AgentConfig(controller="http://127.0.0.1:9", state_dir=tmp_path, host_findings=(found,))
    agent = Agent(backend, cfg)
    try:
        agent.tick()
        for seq in (1, 2):
            batch = agent.build_batch(seq)
            assert [f.code for f in batch.findings if f.rule == "readiness"] == [found.code]
            assert batch.health == int(Severity.FAIL)  # the GPUs alone are healthy
    finally:
        agent.close()


def test_this_host_without_an_nvidia_driver_reports_it() -> None:
    """The checks read this machine's real /proc and /sys: no NVIDIA kernel module here."""
    backend = SimFleet(parse_fleet_spec("1x1xh100-sxm")).backends()[0]
    codes = {f.code: f for f in _readiness(backend)}
    driver = [f for c, f in codes.items() if c.startswith("READINESS_DRIVER_")]
    assert driver and all(f.component == "node" and f.rule == "readiness" for f in driver)
    assert max(f.severity for f in driver) >= Severity.WARN
