"""A new leader's first lost check waits for its takeover (issue 29, the PostgreSQL primary
switch): its cache read afresh and every node's grace period begun. The election thread
announces the new lease (``_leader_changed``) after the replica already counts as leader; a
control-loop pass in between declared every node lost whose pushes the switch had refused
(503 while the database was away), and requeued their jobs: a copy that had finished during
the outage ran a second time (tests/integration/test_pg_switch_jobs.py saw it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from gpufleet.control.db.models import LeaderLease
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.devices.sim import ManualClock
from gpufleet.testing.timescale import scaled

from .conftest import T0, _reset_pg, batch, push, ungated

pytestmark = pytest.mark.process


@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[ControlService, ControlService]]:
    _reset_pg(pg_url)
    clock = ManualClock(T0)
    made = []
    for _ in range(2):
        cfg = ServiceConfig(
            db_url=pg_url,
            policy=ungated(None),
            lease_s=scaled(60.0),  # who leads is set by hand here, never by a lease running out
            renew_s=0.2,
            refresh_s=0.0,
            tick_s=3600.0,  # the test runs the loop's passes by hand
            lost_after_intervals=3,
            stall_s=1000.0,  # no "controller stalled" grace
        )
        svc = ControlService(cfg, clock=clock)
        svc.start()
        made.append(svc)
    try:
        yield made[0], made[1]
    finally:
        for s in made:
            s.stop()


def test_a_loop_pass_during_the_takeover_declares_no_node_lost(
    replicas: tuple[ControlService, ControlService],
) -> None:
    a, b = replicas
    assert a.leading and not b.leading
    push(a, batch("n1", 1, t=T0, interval=2.0))
    a.leader._stop.set()  # a is gone: its election thread tries no more
    assert a.leader._thread is not None
    a.leader._thread.join(5)
    with a.store.sessions.begin() as s:  # its lease ran out
        s.execute(update(LeaderLease).values(expires_s=0.0))
    clock = b.clock
    assert isinstance(clock, ManualClock)
    clock.advance(60.0)  # the switch: n1's pushes refused all along, none stored
    # b's election thread takes the lease; its announcement is held up (a loaded machine)
    held, go = threading.Event(), threading.Event()
    announce = b.leader._on_change

    def slow(leading: bool) -> None:
        held.set()
        go.wait(10)
        announce(leading)

    b.leader._on_change = slow
    b.leader._stop.set()  # only the step below campaigns for b
    assert b.leader._thread is not None
    b.leader._thread.join(5)
    step = threading.Thread(target=b.leader.step)
    step.start()
    try:
        assert held.wait(10) and b.leader.is_leader
        moved = b.tick()  # a loop pass while the takeover is announced
    finally:
        go.set()
        step.join(10)
    assert ("n1", "lost") not in moved, "the takeover's grace had not begun"
    assert b.store.view.nodes["n1"].state == "in_service"
    clock.advance(60.0)  # n1 stays silent past its grace: now it is lost
    assert ("n1", "lost") in b.tick()
