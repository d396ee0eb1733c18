"""Helpers for the scheduler tests: a simulated fleet, its agents and a fresh engine."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.schedulers.embedded import EmbeddedScheduler, JobStore, SimExecutor, nodes_from_sim


@dataclass
class Rig:
    clock: ManualClock
    fleet: SimFleet
    executor: SimExecutor
    store: JobStore

    def engine(self, quotas: dict[str, int] | None = None) -> EmbeddedScheduler:
        return EmbeddedScheduler(
            self.store, self.executor, nodes_from_sim(self.fleet), clock=self.clock, quotas=quotas
        )


class MakeRig(Protocol):
    """The `make_rig` fixture: builds a fresh rig (fleet spec, agent lease) per call."""

    def __call__(self, spec: str = ..., lease_s: float = ...) -> Rig: ...


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[MakeRig]:
    stores: list[JobStore] = []

    def make(spec: str = "2x4xh100-sxm", lease_s: float = 3.0) -> Rig:
        clock = ManualClock(start_s=5000.0)
        fleet = SimFleet(parse_fleet_spec(spec), clock=clock)
        store = JobStore.open(tmp_path / f"sched{len(stores)}.db")
        stores.append(store)
        return Rig(clock, fleet, SimExecutor(fleet=fleet, lease_s=lease_s, clock=clock), store)

    yield make
    for s in stores:
        s.close()
