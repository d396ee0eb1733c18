"""Two controller replicas in one process on one real PostgreSQL (issue 18): one leads, the
other follows; each sees what the other wrote within its refresh; a write from a stale cache
is refused and redone from fresh state; the follower sends jobs reports to the leader (503);
only the leader declares nodes lost, and not one whose agent pushes to the follower; a stale
leader's periodic work is refused by the fencing token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, select, update

from gpufleet.control.api.ingest_http import ingest_body
from gpufleet.control.db.models import LeaderLease, Transition
from gpufleet.control.fleet.actions import node_action
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action
from gpufleet.devices.sim import ManualClock
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.testing.timescale import scaled

from .conftest import T0, _reset_pg, batch, push, ungated, wait_for

OPERATOR = Principal(None, "op", Role.OPERATOR)
# These tests judge who leads, not how fast a lease changes hands (benchmarks/ha.py times the
# takeover): a lease far longer than a test. A 2 s one once ran out on a loaded CI machine while
# the leader's tick held the lease row, and the lost detection the test waited for never ran.
LEASE_S = scaled(60.0)


@pytest.fixture
def pair(pg_url: str) -> Iterator[Callable[..., tuple[ControlService, ControlService]]]:
    made: list[ControlService] = []
    _reset_pg(pg_url)

    def make(**kw: Any) -> tuple[ControlService, ControlService]:
        clock = ManualClock(T0)
        for _ in range(2):
            cfg = ServiceConfig(
                db_url=pg_url,
                policy=ungated(None),
                lease_s=LEASE_S,
                renew_s=0.2,
                refresh_s=0.0,
                # no background loop pass: the tests tick by hand (`sync`) on the shared
                # manual clock; a loop pass of b between a test's clock.advance and its own
                # b.tick() declared n1 lost first, and b.tick() found nothing to do (CI)
                tick_s=3600.0,
                **kw,
            )
            svc = ControlService(cfg, clock=clock)
            svc.start()
            made.append(svc)
        return made[-2], made[-1]

    yield make
    for s in made:
        s.stop()


def sync(*svcs: ControlService) -> None:
    """One loop pass on each replica (the refresh, and the leader's work on the leader)."""
    for s in svcs:
        s.tick()


@pytest.mark.process
def test_one_leads_and_each_sees_the_others_writes(
    pair: Callable[..., tuple[ControlService, ControlService]],
) -> None:
    a, b = pair()
    assert a.leading and not b.leading  # a started first and took the lease
    push(b, batch("n1", 1, t=T0))  # ingest on the follower
    sync(a)
    assert a.store.view.nodes["n1"].state == "in_service"
    node_action(a.store, "n1", Action.CORDON, OPERATOR, "on a")  # an action on the leader
    sync(b)
    assert b.store.view.nodes["n1"].cordoned is True
    views = [(s.store.view.nodes["n1"].state, s.store.view.nodes["n1"].cordoned) for s in (a, b)]
    assert views[0] == views[1]


def test_a_transition_from_a_stale_cache_is_refused_then_redone(
    pair: Callable[..., tuple[ControlService, ControlService]],
) -> None:
    a, b = pair()
    push(a, batch("n1", 1, t=T0))
    sync(b)
    node_action(a.store, "n1", Action.DRAIN, OPERATOR, "on a")  # b's cache: in_service
    assert b.store.nodes["n1"].state == "in_service"
    # b acts from its stale cache: refused under the row lock, b reloads, the caller is told
    with pytest.raises(Exception, match="in the database"):
        node_action(b.store, "n1", Action.DRAIN, OPERATOR, "on b")
    assert b.store.nodes["n1"].state == "draining"
    with a.store.sessions() as s:
        drains = s.scalar(
            select(func.count()).select_from(Transition).where(Transition.to_state == "draining")
        )
    assert drains == 1


def test_the_follower_sends_jobs_reports_to_the_leader(pg_url: str) -> None:
    _reset_pg(pg_url)
    clock = ManualClock(T0)
    made = []
    for _ in range(2):
        cfg = ServiceConfig(db_url=pg_url, policy=ungated(None), lease_s=LEASE_S, renew_s=0.2)
        svc = ControlService(cfg, clock=clock, scheduler=EmbeddedBackend())
        svc.start()
        made.append(svc)
    a, b = made
    try:
        body = batch("n1", 1, t=T0)
        body["jobs"] = {"lease_s": 30.0, "slots": [], "copies": []}
        who = Principal(None, "agent", Role.AGENT)

        reply = asyncio.run(ingest_body(b, who, None, json.dumps(body).encode()))
        assert reply.status == 503 and b"does not lead" in reply.body
        reply = asyncio.run(ingest_body(a, who, None, json.dumps(body).encode()))
        assert reply.status == 200, reply.body
        body.pop("jobs")
        body["seq"] = 2
        reply = asyncio.run(ingest_body(b, who, None, json.dumps(body).encode()))
        assert reply.status == 200  # a batch without jobs: any replica
    finally:
        for s in made:
            s.stop()


def test_only_the_leader_declares_lost_and_not_a_node_heard_elsewhere(
    pair: Callable[..., tuple[ControlService, ControlService]],
) -> None:
    a, b = pair(lost_after_intervals=3, stall_s=1000.0)  # no "controller stalled" grace
    push(b, batch("n1", 1, t=T0, interval=2.0))
    push(b, batch("n2", 1, t=T0, interval=2.0))
    sync(a, b)
    clock = a.clock
    assert isinstance(clock, ManualClock)
    clock.advance(30.0)  # past every grace period
    push(b, batch("n2", 2, t=clock(), interval=2.0))  # n2 keeps pushing, to the follower
    assert b.tick() == []  # the follower never declares anything
    moved = a.tick()
    assert ("n1", "lost") in moved and all(n != "n2" for n, _ in moved)
    sync(b)
    assert b.store.view.nodes["n1"].state == "lost"
    assert wait_for(lambda: b.store.view.nodes["n2"].state == "in_service")


def test_a_stale_leaders_periodic_work_is_refused_by_the_fencing_token(
    pair: Callable[..., tuple[ControlService, ControlService]],
) -> None:
    """The service's own leader work goes through the fence: a leader whose lease another
    replica took while it was stopped, and which still believes it leads (its clock did not
    see the stop), has its lost detection refused in the database: nothing written."""
    a, b = pair(lost_after_intervals=3, stall_s=1000.0)
    push(a, batch("n1", 1, t=T0, interval=2.0))
    a.leader._stop.set()  # a is "stopped": its election thread tries no more
    assert a.leader._thread is not None
    a.leader._thread.join(5)
    with a.store.sessions.begin() as s:  # a's lease runs out while it is "stopped"
        s.execute(update(LeaderLease).values(expires_s=0.0))
    assert b.leader.step() and b.leader.epoch == 2
    a.leader._valid_until = time.monotonic() + 60.0  # resumed: its own clock says it leads
    assert a.leading
    clock = a.clock
    assert isinstance(clock, ManualClock)
    clock.advance(60.0)  # n1 would be lost
    before = a.leader.refusals
    assert a.tick() == []
    assert a.leader.refusals == before + 1 and not a.leading
    with a.store.sessions() as s:
        lost = s.scalar(
            select(func.count()).select_from(Transition).where(Transition.to_state == "lost")
        )
    assert lost == 0
    assert ("n1", "lost") in b.tick()  # the new leader does it, once


def _energy_batch(node: str, seq: int, t0: float, mj0: float, watts: float) -> dict[str, Any]:
    """One GPU, 10 one-second samples at ``watts`` with the energy counter rising by it."""
    body = batch(node, seq, gpus=1, t=t0, k=10)
    fields = body["samples"][0]["fields"]
    fields["power_w"] = [watts] * 10
    fields["energy_mj"] = [mj0 + watts * 1000.0 * i for i in range(10)]
    return body


def test_energy_of_an_agent_that_moves_between_replicas_is_counted_once(
    pair: Callable[..., tuple[ControlService, ControlService]],
) -> None:
    """The agent pushes 10 s to the leader, then fails over and pushes 10 s to the follower:
    the follower's first window starts at the leader's last accounted reading, not at the
    reading it last saw itself (which would count the leader's 10 s a second time)."""
    from gpufleet.control.db.models import EnergyMinute
    from gpufleet.control.state import energy_store

    a, b = pair()
    watts = 500.0
    push(b, _energy_batch("n1", 1, T0, 0.0, watts))  # b sees the first reading (t=T0)
    energy_store_flush = energy_store.flush_energy
    b.store.writer.call(lambda: energy_store_flush(b.store))
    push(a, _energy_batch("n1", 2, T0 + 10, watts * 10_000.0, watts))  # on the leader
    a.store.writer.call(lambda: energy_store_flush(a.store))
    push(b, _energy_batch("n1", 3, T0 + 20, watts * 20_000.0, watts))  # back on b
    b.store.writer.call(lambda: energy_store_flush(b.store))
    with a.store.sessions() as s:
        window_j = s.scalar(select(func.sum(EnergyMinute.window_j)))
        window_s = s.scalar(select(func.sum(EnergyMinute.window_s)))
    # counter windows from T0 to T0+29 s at a constant 500 W: 29 s x 500 W, each second once
    assert window_s == pytest.approx(29.0, abs=0.01)
    assert window_j == pytest.approx(29.0 * watts, rel=0.001)
