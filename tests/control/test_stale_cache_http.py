"""A write over HTTP from a replica whose cache another replica has overtaken (two services on
one real PostgreSQL) is answered 409 naming both states, nothing written, and the retry acts on
the reloaded state; it was a 500 with "Exception in ASGI application" in the log (found by
tests/upgrade/test_rolling_upgrade.py: an agent's validation result posted to a replica whose
cache still said validating after the other replica declared the node lost)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpufleet.control.api.app import create_app
from gpufleet.control.db.models import Transition
from gpufleet.control.fleet.actions import node_action
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action
from gpufleet.devices.sim import ManualClock
from gpufleet.testing.timescale import scaled

from .conftest import T0, _reset_pg, batch, push, ungated

pytestmark = pytest.mark.process


@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[ControlService, ControlService]]:
    _reset_pg(pg_url)
    clock = ManualClock(T0)
    made: list[ControlService] = []
    try:
        for _ in range(2):
            cfg = ServiceConfig(
                db_url=pg_url,
                policy=ungated(None),
                lease_s=scaled(60.0),
                renew_s=0.2,
                refresh_s=0.0,
                tick_s=3600.0,  # no loop pass of its own: b's cache stays as the test left it
            )
            made.append(ControlService(cfg, clock=clock))
            made[-1].start()
        yield made[0], made[1]
    finally:
        for s in made:
            s.stop()


def test_an_action_from_a_stale_cache_is_a_409_and_the_retry_acts(
    replicas: tuple[ControlService, ControlService],
) -> None:
    a, b = replicas
    push(a, batch("n1", 1, t=T0))
    b.tick()  # b reads n1, in service
    node_action(a.store, "n1", Action.DRAIN, Principal(None, "op", Role.OPERATOR), "on a")
    assert b.store.nodes["n1"].state == "in_service"  # b has not read a's drain
    token = b.store.tokens.create("operator", name="t-operator")[0]
    client = TestClient(create_app(b))  # raises any unhandled server error in the test
    headers = {"Authorization": f"Bearer {token}"}

    def act(action: str) -> Any:
        return client.post(f"/api/v1/nodes/n1/actions/{action}", headers=headers, json={})

    with b.store.sessions() as s:
        moves = s.scalar(select(func.count()).select_from(Transition)) or 0
    r = act("drain")
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == (
        "node n1: draining in the database, in_service in this replica's cache"
    )
    # nothing written, b reloaded: a resume (allowed from draining only) goes through at once
    assert b.store.nodes["n1"].state == "draining"
    r = act("resume")
    assert r.status_code == 200, r.text
    with b.store.sessions() as s:
        rows = s.execute(select(Transition.to_state).order_by(Transition.id)).scalars().all()
    assert len(rows) == moves + 1 and rows[-2:] == ["draining", "in_service"]
