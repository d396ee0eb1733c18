"""End-to-end fixtures: a real controller on loopback with simulated agents (``Testbed``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufleet.devices.sim import SimFleet
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.testing.testbed import Agents, Controller


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
