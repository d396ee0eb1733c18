"""End-to-end fixtures: a real controller on loopback with simulated agents (``Testbed``), or
with the real node agent of one simulated node (`RealAgent`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.devices.sim import SimFleet, SimNode, parse_fleet_spec
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.testing.testbed import Agents, Controller
from tests.control.conftest import own_pg  # noqa: F401  (a PostgreSQL server of a test's own)


def fleet_of(names: list[str], gpus: int = 2, model: str = "h100-sxm") -> SimFleet:
    return SimFleet(FleetSpec(tuple(NodeSpec(n, model, gpus) for n in names)))


def embedded(ctl: Controller) -> EmbeddedBackend:
    """The started controller's embedded scheduler."""
    assert ctl.service is not None and isinstance(ctl.service.scheduler, EmbeddedBackend)
    return ctl.service.scheduler


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Callable[..., tuple[Controller, Agents]]]:
    """``bed(nodes=[...], scheduler=..., lease_s=...)``: a started controller and agents."""
    started: list[tuple[Controller, Agents]] = []

    def make(
        nodes: list[str] | None = None,
        scheduler: str = "embedded",
        run_jobs: bool = True,
        lease_s: float = 30.0,
        **options: object,
    ) -> tuple[Controller, Agents]:
        ctl = Controller(tmp_path / "data", scheduler=scheduler, options=dict(options)).start()
        fleet = fleet_of(nodes or ["n1", "n2", "n3"])
        agents = Agents(
            ctl.url,
            ctl.token("agent"),
            fleet,
            run_jobs=run_jobs,
            lease_s=lease_s,
            tokens=ctl.node_tokens(fleet),  # node-bound: only these may offer job slots
        ).start()
        started.append((ctl, agents))
        return ctl, agents

    yield make
    for ctl, agents in started:
        agents.stop()
        ctl.stop()


@dataclass
class RealAgent:
    """The real node agent (`gpufleet.agent.runner.Agent`) of ``sim-00``, a simulated node of
    4 H200, running in a thread against a controller on loopback (no scheduler)."""

    ctl: Controller
    fleet: SimFleet
    node: SimNode
    agent: Agent


@pytest.fixture
def real_agent(tmp_path: Path) -> Iterator[RealAgent]:
    """`RealAgent`: the agent samples every 0.2 s, pushes every 0.3 s (token bound to sim-00),
    and keeps its state in ``tmp_path/agent``; stopped, then the controller, at the end."""
    ctl = Controller(tmp_path / "data", scheduler="none").start()
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        token = ctl.token("agent", node="sim-00")
        fleet = SimFleet(parse_fleet_spec("1x4xh200"))
        node = fleet.node("sim-00")
        cfg = AgentConfig(
            fast_interval_s=0.2,
            push_interval_s=0.3,
            controller=ctl.url,
            token=token,
            state_dir=tmp_path / "agent",
        )
        agent = Agent(node.backend(), cfg)
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        yield RealAgent(ctl, fleet, node, agent)
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        ctl.stop()
