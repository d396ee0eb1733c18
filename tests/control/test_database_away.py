"""PostgreSQL restarting or away under ingest (issue 29): agents got HTTP 500s and the log
'Exception in ASGI application'. Now a database that is away is a 503 with ``Retry-After``
(the batch is not acknowledged, so the agent keeps it), operator writes are 503s too, and the
controller reconnects by itself: the same service, never restarted, stores again once the
server is back, and everything it acknowledged is in the database."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpufleet.control.api.app import create_app
from gpufleet.control.db.models import Node
from gpufleet.control.service import ControlService
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
