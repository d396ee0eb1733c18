"""The controller's OpenAPI document states the wire contract: the ingest body's limits (the
ones the fast parser enforces), the job submission's and the validation result's; and the
ingest endpoint enforces what the document states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.wire import limits


@pytest.fixture
def client(tmp_path: Path) -> Any:
    svc = ControlService(ServiceConfig(data_dir=tmp_path / "data"))
    svc.ingest.start()
    try:
        yield TestClient(create_app(svc)), svc
    finally:
        svc.ingest.stop()
        svc.engine.dispose()


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema with a ``$ref`` (to the components, or to ``$defs`` kept inline) followed."""
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    return schema


def _prop(doc: dict[str, Any], schema: dict[str, Any], *path: str) -> dict[str, Any]:
    for step in path:
        schema = _resolve(doc, schema)
        if step == "[]":
            schema = schema["items"]
        elif step == "?":  # the non-null branch of an optional value
            schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
        else:
            schema = schema["properties"][step]
    return _resolve(doc, schema)


def test_ingest_body_states_its_limits(client: Any) -> None:
    c, _ = client
    doc = c.get("/api/v1/openapi.json").json()
    body = doc["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]
    batch = body["schema"]
    assert batch["additionalProperties"] is False
    assert _prop(doc, batch, "samples")["maxItems"] == 32  # 16 GPUs x 2 sampling tiers
    block = _prop(doc, batch, "samples", "[]")
    assert block["additionalProperties"] is False
    assert set(block["required"]) == {"gpu_uuid", "gpu_index", "t", "fields"}
    assert _prop(doc, block, "t")["maxItems"] == 3600  # the agent's cap per GPU and tier
    index = _prop(doc, block, "gpu_index")
    assert (index["minimum"], index["exclusiveMaximum"]) == (0, 16)  # at most 16 GPUs a node
    uuid = _prop(doc, block, "gpu_uuid")
    assert (uuid["minLength"], uuid["maxLength"]) == (1, limits.MAX_UUID)
    fields = _prop(doc, block, "fields")
    assert fields["maxProperties"] == limits.MAX_FIELDS_PER_BLOCK
    assert list(fields["patternProperties"]) == [limits.FIELD_NAME_PATTERN]
    assert fields["propertyNames"]["maxLength"] == limits.MAX_FIELD_NAME
    hb = _prop(doc, batch, "heartbeat_interval_s")
    assert (hb["minimum"], hb["maximum"]) == (0.1, 3600)  # 1e-9 made a node lost at once
    assert _prop(doc, batch, "seq")["minimum"] == 1
    assert _prop(doc, batch, "findings")["maxItems"] == limits.MAX_FINDINGS
    assert _prop(doc, batch, "events", "[]", "gpu_index")["exclusiveMaximum"] == 16
    assert _prop(doc, batch, "devices", "?")["maxItems"] == 16
    lease = _prop(doc, batch, "jobs", "?", "lease_s")
    assert (lease["exclusiveMinimum"], lease["maximum"]) == (0, 86400)


def test_job_and_validation_bodies_state_their_limits(client: Any) -> None:
    c, _ = client
    doc = c.get("/api/v1/openapi.json").json()

    def body(path: str) -> dict[str, Any]:
        req = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        return _resolve(doc, req["schema"])

    job = body("/api/v1/jobs")
    assert (job["properties"]["gpus"]["minimum"], job["properties"]["gpus"]["maximum"]) == (1, 1024)
    assert job["required"] == ["name"] and job["additionalProperties"] is False
    verdict = body("/api/v1/validation-results")["properties"]["verdict"]
    assert sorted(verdict["enum"]) == ["fail", "pass", "warn"]


def test_ingest_refuses_past_the_stated_limits(client: Any) -> None:
    c, svc = client
    token = svc.store.tokens.create("agent")[0]
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def push(seq: int, t: list[float], gpu_index: int = 0) -> Any:
        power = [float(i % 700) for i in range(len(t))]
        block = {"gpu_uuid": "GPU-0", "gpu_index": gpu_index, "t": t, "fields": {"power_w": power}}
        body = {"node": "n1", "agent_id": "a1", "seq": seq, "sent_at_s": t0, "samples": [block]}
        return c.post("/api/v1/ingest", content=json.dumps(body), headers=h)

    t0 = svc.store.clock() - 3600  # an hour of samples, all inside the controller's window
    at_limit = [t0 + i for i in range(3600)]
    assert push(1, at_limit).status_code == 200
    r = push(2, [*at_limit, t0 + 3600])
    assert r.status_code == 422 and r.json()["detail"].startswith("samples.0.t: ")
    r = push(3, [t0], gpu_index=1024)
    assert r.status_code == 422 and r.json()["detail"].startswith("samples.0.gpu_index: ")
