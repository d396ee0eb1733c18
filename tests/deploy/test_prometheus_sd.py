"""``GET /api/v1/prometheus/sd``: one target group per node the token may see (a tenant's
viewer: its nodes and shared ones), the agent's address from ``metrics_address`` or
``NODE:PORT``, and the __meta labels Prometheus relabels from."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService
from tests.control.conftest import batch


def test_targets_per_token(make_service: Callable[..., ControlService]) -> None:
    svc = make_service()
    admin = svc.store.tokens.create("admin")[0]
    agent = svc.store.tokens.create("agent")[0]
    client = TestClient(create_app(svc))
    for n in ("na", "nb", "shared"):
        r = client.post("/api/v1/ingest", json=batch(n, 1), headers=_h(agent))
        assert r.status_code == 200, r.text
    for node, body in (
        ("na", {"tenant": "a", "rack": "r1", "labels": {"metrics_address": "10.0.0.7:9100"}}),
        ("nb", {"tenant": "b", "labels": {"metrics_address": "not an address"}}),
    ):
        assert (
            client.patch(f"/api/v1/nodes/{node}", json=body, headers=_h(admin)).status_code == 200
        )
    viewer_a = svc.store.tokens.create("viewer", tenant="a")[0]

    assert client.get("/api/v1/prometheus/sd").status_code == 401
    everything = client.get("/api/v1/prometheus/sd?port=9500", headers=_h(admin)).json()
    assert [g["targets"] for g in everything] == [
        ["10.0.0.7:9100"],  # its label
        ["nb:9500"],  # a label that is no HOST:PORT is ignored, not passed on
        ["shared:9500"],
    ]
    na = everything[0]["labels"]
    assert na["__meta_gpufleet_node"] == "na"
    assert (na["__meta_gpufleet_tenant"], na["__meta_gpufleet_rack"]) == ("a", "r1")
    assert "__meta_gpufleet_tenant" not in everything[2]["labels"]  # no tenant: no label
    seen_by_a = client.get("/api/v1/prometheus/sd", headers=_h(viewer_a)).json()
    assert [g["labels"]["__meta_gpufleet_node"] for g in seen_by_a] == ["na", "shared"]
    assert client.get("/api/v1/prometheus/sd?port=0", headers=_h(admin)).status_code == 422


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
