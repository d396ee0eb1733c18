"""Chaos for maintenance campaigns (issue 15): over 20 seeds (the first 5 under the ``dev``
profile of the fast tier), the controller is thrown away at random moments of a campaign (its
writer stopped, nothing flushed, a new controller started on the same database) while the
played agents answer late at random. Each node step is one transaction, so a crash between two
writer commands is a crash between any two steps, and a crash inside one rolls it back (the
step never happened). Every seed must end with every node
updated exactly once, no step taken twice, none left cordoned and all in service, and the
in-service capacity never below the floor. (A real ``kill -9`` of a controller process runs in
tests/integration/test_campaign_processes.py.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.control.campaigns import ops
from gpufleet.control.campaigns.engine import capacity
from gpufleet.control.db.models import MaintStep
from gpufleet.control.state.auth import Principal, Role
from gpufleet.devices.sim import ManualClock
from gpufleet.wire import WireUpdateReport
from tests.hypothesis_budget import seeds
from tests.maintenance.test_campaign_engine import NEW, OP, T0, make, setup, spec


@pytest.mark.parametrize("seed", seeds(20, dev_count=5))
def test_controller_crashes_at_random_steps(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(T0)
    svc, fleet = setup(tmp_path, clock, n=5)
    cid = ops.start(svc.store, spec(batch=2, floor=0.6), OP)
    crashes = sorted(rng.sample(range(1, 40), 3))
    seen: list[float] = []
    for i in range(300):
        if crashes and i == crashes[0]:
            crashes.pop(0)
            svc.ingest.stop()  # the writer ends; nothing else is flushed or closed
            svc.engine.dispose()
            svc = make(tmp_path, clock)
            fleet.svc = svc
        clock.advance(1.0)
        fleet.heartbeat_all()
        for node, order in dict(ops.orders(svc.store)).items():
            if order.key in fleet.keys:
                continue
            fleet.keys.add(order.key)
            fleet.updates[node] += 1
            fleet.version[node] = NEW
        for key in sorted(fleet.keys):  # reports arrive late, at random, maybe twice
            node = key.split("-", 1)[1]
            if rng.random() < 0.5:
                rep = WireUpdateReport(node=node, key=key, exit_code=0)
                ops.report(svc.store, rep, Principal(None, "a", Role.AGENT, node=node))
        svc.tick()
        with svc.store.sessions() as s:
            in_gpus, total, _, _ = capacity(svc.store, s)
        seen.append(in_gpus / total)
        if ops.status(svc.store, cid)["state"] == "done":
            break
    st = ops.status(svc.store, cid)
    assert st["state"] == "done", (seed, st)
    assert set(fleet.updates.values()) == {1}, fleet.updates
    with svc.store.sessions() as s:
        rows = s.execute(select(MaintStep.node, MaintStep.step)).all()
    assert len(rows) == len(set(rows)) == 5 * 8  # every step once, none skipped
    for v in svc.store.view.nodes.values():
        assert v.state == "in_service" and not v.cordoned
    assert min(seen) >= 0.6 - 1e-9
    svc.ingest.stop()
    svc.engine.dispose()
