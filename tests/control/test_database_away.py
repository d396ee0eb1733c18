"""PostgreSQL restarting or away under ingest (issue 29): agents got HTTP 500s and the log
'Exception in ASGI application'. Now a database that is away is a 503 with ``Retry-After``
(the batch is not acknowledged, so the agent keeps it), operator writes are 503s too, and the
controller reconnects by itself: the same service, never restarted, stores again once the
server is back, and everything it acknowledged is in the database."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpufleet.control.api.app import create_app
from gpufleet.control.db.models import Node
from gpufleet.control.service import ControlService
from gpufleet.devices.sim.clock import ManualClock
from tests.control.conftest import PgServer, batch

pytestmark = pytest.mark.process  # a PostgreSQL server of the test's own, stopped and started


def _nodes(svc: ControlService) -> set[str]:
    with svc.store.sessions() as s:
        return set(s.scalars(select(Node.name)))


def test_database_away_is_503_with_retry_after_and_the_controller_reconnects(
    make_service: Callable[..., ControlService], own_pg: PgServer
) -> None:
    svc = make_service(db_url=own_pg.url)
    agent = svc.store.tokens.create("agent", name="t-agent")[0]
    operator = svc.store.tokens.create("operator", name="t-operator")[0]
    client = TestClient(create_app(svc))  # raises any unhandled server error in the test
    push = {"Authorization": f"Bearer {agent}"}
    ops = {"Authorization": f"Bearer {operator}"}
    assert client.post("/api/v1/ingest", json=batch("n1", 1), headers=push).status_code == 200

    own_pg.stop("fast")  # as `pg_ctl restart -m fast` begins; then an outage
    for seq in (2, 3):
        r = client.post("/api/v1/ingest", json=batch("n2", seq), headers=push)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"].isdigit() and "database is unavailable" in r.text
    r = client.post("/api/v1/nodes/n1/actions/cordon", json={"reason": "t"}, headers=ops)
    assert r.status_code == 503 and "Retry-After" in r.headers, r.text

    own_pg.start()
    acked = client.post("/api/v1/ingest", json=batch("n2", 2), headers=push)
    assert acked.status_code == 200, acked.text
    assert acked.json()["seq"] == 2
    r = client.post("/api/v1/nodes/n1/actions/cordon", json={"reason": "t"}, headers=ops)
    assert r.status_code == 200, r.text
    assert _nodes(svc) == {"n1", "n2"}  # every acknowledged batch's node stored
    with svc.store.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Node)) == 2


def test_an_outage_shorter_than_the_lease_declares_no_pushing_node_lost(
    make_service: Callable[..., ControlService], own_pg: PgServer, clock: ManualClock
) -> None:
    """The database away for 4x a node's lost threshold while its agent keeps pushing (every
    push answered 503), the leader's lease held throughout (no takeover, so no grace): the first
    pass after the database is back, before any push is stored again, must not declare the node
    lost (on the old code it did: 'no heartbeat for 24.0 s'); a node silent after the outage is
    still lost after its threshold of listening time."""
    svc = make_service(db_url=own_pg.url)
    agent = svc.store.tokens.create("agent", name="t-agent")[0]
    client = TestClient(create_app(svc))
    push = {"Authorization": f"Bearer {agent}"}
    t0 = clock()
    for node in ("n1", "n2"):
        body = batch(node, 1, t=t0, interval=2.0)
        assert client.post("/api/v1/ingest", json=body, headers=push).status_code == 200
    assert svc.store.nodes["n1"].state == "in_service"
    limit = svc.store.lost_after_intervals * 2.0

    own_pg.stop("fast")
    seq = 2
    while clock() - t0 < 4 * limit:  # the agents push every interval; each push is refused
        clock.advance(2.0)
        for node in ("n1", "n2"):
            r = client.post("/api/v1/ingest", json=batch(node, seq, t=clock()), headers=push)
            assert r.status_code == 503, r.text
        with contextlib.suppress(Exception):  # the loop's pass fails while the database is away
            svc.tick()
        seq += 1
    own_pg.start()
    clock.advance(1.0)
    svc.tick()  # the first pass with the database back, before any push is stored
    assert {n: svc.store.nodes[n].state for n in ("n1", "n2")} == {
        "n1": "in_service",
        "n2": "in_service",
    }

    # n1 pushes again; n2 stays silent: lost after its threshold of time the controller heard
    r = client.post("/api/v1/ingest", json=batch("n1", seq, t=clock()), headers=push)
    assert r.status_code == 200, r.text
    for _ in range(int(limit / 2.0) + 2):
        clock.advance(2.0)
        seq += 1
        assert (
            client.post(
                "/api/v1/ingest", json=batch("n1", seq, t=clock()), headers=push
            ).status_code
            == 200
        )
        svc.tick()
    assert svc.store.nodes["n1"].state == "in_service"
    assert svc.store.nodes["n2"].state == "lost"
