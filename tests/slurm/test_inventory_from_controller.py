"""Issue 14 item 7, end to end: the agent reads its host's CPU topology and memory, sends them
with its devices, the control plane keeps them, and `config slurm --inventory-from URL` writes
NodeName lines with them and a driver feature per node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.cli.app import app
from gpufleet.devices.host import read_host
from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.testing.testbed import Controller, wait_for

pytestmark = pytest.mark.process


def test_agent_reported_topology_reaches_slurm_node_lines(tmp_path: Path) -> None:
    host = read_host()  # this machine's real /proc and /sys
    assert host.complete and host.memory_mb
    ctl = Controller(tmp_path / "data").start()
    fleet = SimFleet(parse_fleet_spec("1x2xh100-sxm"))
    backend = fleet.backends()[0]
    token = ctl.token("agent", node=backend.node_name)
    cfg = AgentConfig(controller=ctl.url, token=token, state_dir=tmp_path / "agent", host=host)
    agent = Agent(backend, cfg)
    try:
        agent.tick()
        agent.push_once()
        detail = wait_for(
            lambda: ctl.call("GET", f"/api/v1/nodes/{backend.node_name}").json(), 10, "node"
        )
        assert detail["host"]["cpus"] == host.cpus
        assert detail["host"]["memory_mb"] == host.memory_mb
        viewer = tmp_path / "viewer.token"
        viewer.write_text(ctl.token("viewer"))
        out = tmp_path / "slurm"
        r = CliRunner().invoke(
            app,
            [
                "config",
                "slurm",
                "--inventory-from",
                ctl.url,
                "--inventory-token-file",
                str(viewer),
                "--out",
                str(out),
            ],
        )
        assert r.exit_code == 0, r.output
    finally:
        agent.close()
        ctl.stop()
    conf = (out / "slurm.conf").read_text()
    line = next(ln for ln in conf.splitlines() if ln.startswith(f"NodeName={backend.node_name}"))
    assert f"CPUs={host.cpus} " in line and f"RealMemory={host.memory_mb}" in line
    assert f"ThreadsPerCore={host.threads_per_core}" in line
    driver = backend.device_info(0).driver_version
    assert driver and re.search(
        r"Features=\S*h100\S*driver_" + re.escape(driver.split(".")[0]), line
    )
