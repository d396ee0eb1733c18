"""The REST API: the authorization matrix (each role x each endpoint), ingest answers (200,
duplicate, 401/403, 413, 415, 422, 429 with Retry-After, gzip), audit of writes, and tokens
never appearing in logs."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService
from gpufleet.wire import MAX_BATCH_BYTES
from tests.control.conftest import T0, batch, fail_finding

ROLES = ("admin", "operator", "viewer", "agent", "none")
RANK = {"viewer": 1, "operator": 2, "admin": 3}


@pytest.fixture
def env(
    make_service: Callable[..., ControlService],
) -> Iterator[tuple[TestClient, dict[str, str], ControlService]]:
    svc = make_service()
    tokens = {r: svc.store.tokens.create(r, name=f"t-{r}")[0] for r in ROLES[:4]}
    tokens["agent-n2"] = svc.store.tokens.create("agent", node="n2")[0]
    client = TestClient(create_app(svc))
    h = {"Authorization": f"Bearer {tokens['agent']}"}
    for n in ("n1", "n2", "n3"):
        assert client.post("/api/v1/ingest", json=batch(n, 1), headers=h).status_code == 200
    yield client, tokens, svc


def hdr(tokens: dict[str, str], role: str) -> dict[str, str]:
    return {} if role == "none" else {"Authorization": f"Bearer {tokens[role]}"}


# (method, path, body, minimum role)
ENDPOINTS = [
    ("GET", "/api/v1/summary", None, "viewer"),
    ("GET", "/api/v1/nodes", None, "viewer"),
    ("GET", "/api/v1/heatmap?metric=power_w", None, "viewer"),
    ("GET", "/api/v1/nodes/n1", None, "viewer"),
    ("GET", "/api/v1/nodes/n1/transitions", None, "viewer"),
    ("GET", "/api/v1/nodes/n1/gpus/0/series", None, "viewer"),
    ("GET", "/api/v1/gpus", None, "viewer"),
    ("GET", "/api/v1/findings", None, "viewer"),
    ("GET", "/api/v1/events", None, "viewer"),
    ("GET", "/api/v1/policy", None, "viewer"),
    ("GET", "/api/v1/audit", None, "operator"),
    ("POST", "/api/v1/nodes/n1/actions/cordon", {"reason": "t"}, "operator"),
    ("PATCH", "/api/v1/nodes/n1", {"rack": "r1"}, "operator"),
    ("POST", "/api/v1/validation-results", {"node": "n3", "verdict": "pass"}, "operator+agent"),
    ("PUT", "/api/v1/policy", {"max_out_fraction": 0.2}, "admin"),
    ("GET", "/api/v1/tokens", None, "admin"),
    ("POST", "/api/v1/tokens", {"role": "viewer"}, "admin"),
]


@pytest.mark.parametrize("role", ROLES)
def test_authorization_matrix(
    env: tuple[TestClient, dict[str, str], ControlService], role: str
) -> None:
    client, tokens, _ = env
    for method, path, body, need in ENDPOINTS:
        r = client.request(method, path, json=body, headers=hdr(tokens, role))
        if role == "none":
            expected = {401}
        elif role == "agent" and need.endswith("+agent"):
            expected = {200}  # a node's agent may post its own validation result
        elif role != "agent" and RANK[role] >= RANK[need.split("+")[0]]:
            expected = {200, 201}
        else:
            expected = {403}
        assert r.status_code in expected, (role, method, path, r.status_code, r.text)


def test_viewer_cannot_act_and_refusal_is_audited(
    env: tuple[TestClient, dict[str, str], ControlService],
) -> None:
    client, tokens, svc = env
    r = client.post("/api/v1/nodes/n1/actions/drain", headers=hdr(tokens, "viewer"))
    assert r.status_code == 403
    assert svc.store.nodes["n1"].state == "in_service"
    client.post(
        "/api/v1/nodes/n2/actions/drain",
        json={"reason": "maintenance"},
        headers=hdr(tokens, "operator"),
    )
    audit = client.get("/api/v1/audit", headers=hdr(tokens, "admin")).json()
    by_action = {(a["action"], a["outcome"]) for a in audit}
    assert ("node.drain", "ok") in by_action
    assert any(a["outcome"] == "refused" and a["role"] == "viewer" for a in audit)
    assert svc.store.nodes["n2"].state == "draining"
    assert (
        client.post(
            "/api/v1/nodes/n2/actions/validate", headers=hdr(tokens, "operator")
        ).status_code
        == 409
    )


def test_ingest_answers(env: tuple[TestClient, dict[str, str], ControlService]) -> None:
    client, tokens, svc = env
    h = hdr(tokens, "agent")
    ok = client.post("/api/v1/ingest", json=batch("n1", 2, devices=False), headers=h)
    assert ok.json() == {"agent_id": "agent-n1", "seq": 2, "duplicate": False}
    dup = client.post("/api/v1/ingest", json=batch("n1", 2, devices=False), headers=h)
    assert dup.json()["duplicate"] is True
    gz = gzip.compress(json.dumps(batch("n1", 3, devices=False)).encode())
    r = client.post(
        "/api/v1/ingest",
        content=gz,
        headers={**h, "Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert r.status_code == 200
    # bound agent token: its own node only; viewers cannot push
    bound = hdr(tokens, "agent-n2")
    assert client.post("/api/v1/ingest", json=batch("n1", 9), headers=bound).status_code == 403
    assert client.post("/api/v1/ingest", json=batch("n2", 9), headers=bound).status_code == 200
    assert (
        client.post(
            "/api/v1/ingest", json=batch("n1", 9), headers=hdr(tokens, "viewer")
        ).status_code
        == 403
    )
    assert client.post("/api/v1/ingest", json=batch("n1", 9)).status_code == 401
    bad = batch("n1", 4)
    bad["samples"][0]["fields"]["power_w"] = [1.0]  # 1 value for 2 timestamps
    r = client.post("/api/v1/ingest", json=bad, headers=h)
    assert r.status_code == 422 and "samples.0.fields.power_w" in r.json()["detail"]
    r = client.post("/api/v1/ingest", json={**batch("n1", 4), "seq": 0}, headers=h)
    assert r.status_code == 422 and r.json()["detail"].startswith("seq")
    r = client.post("/api/v1/ingest", content=b"{not json", headers=h)
    assert r.status_code == 422
    r = client.post("/api/v1/ingest", content=b"x" * (MAX_BATCH_BYTES + 1), headers=h)
    assert r.status_code == 413
    bomb = gzip.compress(b" " * (MAX_BATCH_BYTES + 10))
    r = client.post("/api/v1/ingest", content=bomb, headers={**h, "Content-Encoding": "gzip"})
    assert r.status_code == 413
    r = client.post("/api/v1/ingest", content=b"abc", headers={**h, "Content-Encoding": "br"})
    assert r.status_code == 415
    svc.ingest.max_pending = 0  # back-pressure
    r = client.post("/api/v1/ingest", json=batch("n1", 5), headers=h)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1


def test_api_views_after_fault(env: tuple[TestClient, dict[str, str], ControlService]) -> None:
    client, tokens, _ = env
    h = hdr(tokens, "agent")
    client.post(
        "/api/v1/ingest",
        json=batch("n3", 2, devices=False, findings=[fail_finding("n3", gpu=1)]),
        headers=h,
    )
    v = hdr(tokens, "viewer")
    summ = client.get("/api/v1/summary", headers=v).json()
    assert summ["by_state"]["draining"] == 1 and summ["by_state"]["in_service"] == 2
    hm = client.get("/api/v1/heatmap?metric=health", headers=v).json()
    assert hm["values"][hm["nodes"].index("n3")] == [0.0, 2.0]
    hm = client.get("/api/v1/heatmap?metric=power_pct", headers=v).json()
    assert hm["values"][0] == pytest.approx([100.0 / 7, 101.0 / 7])  # 100 W, 101 W of 700 W
    findings = client.get("/api/v1/findings?node=n3", headers=v).json()
    assert [f["code"] for f in findings] == ["XID_79"]
    fid = findings[0]["id"]
    r = client.post(f"/api/v1/findings/{fid}/acknowledge", headers=hdr(tokens, "operator"))
    assert r.status_code == 200 and r.json()["acknowledged_by"] == "operator:t-operator"
    ev = client.get("/api/v1/events?node=n3", headers=v).json()
    assert {"transition", "finding", "finding_acknowledged"} <= {e["kind"] for e in ev}


def test_tokens_never_logged(
    make_service: Callable[..., ControlService], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    svc = make_service()
    tok = svc.store.tokens.create("agent")[0]
    client = TestClient(create_app(svc))
    client.post("/api/v1/ingest", json=batch("n1", 1), headers={"Authorization": f"Bearer {tok}"})
    client.get(f"/api/v1/summary?access_token={tok}", headers={"Authorization": f"Bearer {tok}x"})
    logging.getLogger("gpufleet.control").warning("oops %s", tok)  # even a careless log line
    # every record but the test client's own (httpx logs the URL it was asked to fetch)
    text = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("httpx"))
    assert tok not in text
    assert tok[:7] in text  # the redacted stub shows which token it was


def test_heatmap_shows_a_gpu_that_stopped_answering_as_no_data(
    env: tuple[TestClient, dict[str, str], ControlService],
) -> None:
    """A GPU fallen off the bus stops sending samples while its node's others go on: the
    heatmap must show it as no data (like the node page's "no data Ns"), not its last value."""
    client, tokens, _ = env
    later = batch("n1", 2, devices=False, t=T0 + 30)
    later["samples"] = [s for s in later["samples"] if s["gpu_index"] == 0]  # GPU 1 is silent
    assert (
        client.post("/api/v1/ingest", json=later, headers=hdr(tokens, "agent")).status_code == 200
    )
    v = hdr(tokens, "viewer")
    for metric in ("gpu_util_pct", "power_pct"):
        hm = client.get(f"/api/v1/heatmap?metric={metric}", headers=v).json()
        row = hm["values"][hm["nodes"].index("n1")]
        assert row[0] is not None and row[1] is None, (metric, row)
        other = hm["values"][hm["nodes"].index("n2")]
        assert None not in other  # every GPU of n2 answered at its newest sample
