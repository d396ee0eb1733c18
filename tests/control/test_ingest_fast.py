"""The fast ingest path: vectorised telemetry writes and rollups, numpy validation of samples,
group commit with duplicates inside one group, and the ASGI fast path answering like the route.

Expected values are worked out by hand from the inputs written in each test."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpufleet.control.api.app import create_app
from gpufleet.control.api.ingest_http import handle_ingest
from gpufleet.control.db.models import IngestedBatch
from gpufleet.control.ingest.queue import IngestRejected, parse_batch
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.rings import FIELD_INDEX, NF, TelemetryStore
from gpufleet.control.state.store import IngestItem
from tests.control.conftest import T0, batch

U, P = FIELD_INDEX["gpu_util_pct"], FIELD_INDEX["power_w"]


def _block(util: list[float | None], power: list[float | None]) -> np.ndarray:
    m = np.full((NF, len(util)), np.nan)
    m[U] = [np.nan if v is None else v for v in util]
    m[P] = [np.nan if v is None else v for v in power]
    return m


@pytest.mark.parametrize("gpus", [[0, 1], [1, 5]])  # consecutive (slice) and scattered rows
def test_add_blocks_latest_series_rollups(gpus: list[int]) -> None:
    ts = TelemetryStore(capacity=4)
    m0 = 60 * 1000  # a minute boundary
    t0 = float(m0)
    # GPU a: util 10, 20, 30 at t0+1..3; power only at the first two (a slow field)
    # GPU b: util 1, 2, 3; power 100, 200, 300
    t = np.array([[t0 + 1, t0 + 2, t0 + 3]] * 2)
    mat = np.stack([_block([10, 20, 30], [50, 70, None]), _block([1, 2, 3], [100, 200, 300])])
    assert ts.add_blocks("n", gpus, t, mat) == 6
    a, b = gpus
    ta, la = ts.latest("n", a)
    assert ta == t0 + 3 and la["gpu_util_pct"] == 30 and la["power_w"] == 70  # newest non-null
    assert ts.latest("n", b)[1]["power_w"] == 300
    assert ts.latest_field("n", b + 1, "gpu_util_pct")[a] == 30
    assert ts.latest("n", 3 if 3 not in gpus else 2) == (None, {})
    # wrap the ring (capacity 4): 2 more samples, one in the next minute
    t2 = np.array([[t0 + 4, t0 + 61]] * 2)
    mat2 = np.stack([_block([40, 50], [None, None]), _block([4, 5], [400, 500])])
    ts.add_blocks("n", gpus, t2, mat2)
    times, cols = ts.series("n", a, ["gpu_util_pct"])
    assert times == [t0 + 2, t0 + 3, t0 + 4, t0 + 61]  # the oldest sample was overwritten
    assert cols["gpu_util_pct"] == [20, 30, 40, 50]
    assert ts.latest("n", a)[1]["power_w"] == 70  # still the newest power reading
    closed = {(g, m): (n, s) for _, g, m, n, s in ts.take_closed_minutes(0, all_minutes=True)}
    # minute t0: GPU a util 10,20,30,40 -> count 4, min 10, mean 25, max 40; power 50,70
    n_a, s_a = closed[(a, m0)]
    assert n_a == 4 and s_a["gpu_util_pct"] == [4, 10, 25, 40] and s_a["power_w"] == [2, 50, 60, 70]
    assert closed[(b, m0)][1]["power_w"] == [4, 100, 250, 400]
    assert closed[(a, m0 + 60)][1]["gpu_util_pct"] == [1, 50, 50, 50]
    assert closed[(b, m0 + 60)][1]["power_w"] == [1, 500, 500, 500]
    assert len(closed) == 4  # no entry for rows of GPUs that sent nothing


def test_parse_groups_and_values() -> None:
    body = batch("n1", 1, gpus=3, k=2)
    body["samples"].append({**body["samples"][0], "t": [T0 + 5, T0 + 6]})  # GPU 0 again
    body["samples"][1]["fields"]["power_w"] = [None, 1e39]  # beyond float32: no reading
    parsed = parse_batch(json.dumps(body).encode())
    assert [g.gpus for g in parsed.arrays] == [[0, 1, 2], [0]]
    first = parsed.arrays[0]
    assert first.t.shape == (3, 2) and first.mat.shape == (3, NF, 2)
    assert first.mat[2, U].tolist() == [20.0, 21.0]  # util = 10 * gpu + i
    assert np.isnan(first.mat[1, P]).all()
    assert [len(s.t) for s in parsed.batch.samples] == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (
            lambda s: s[1]["fields"].__setitem__("power_w", [1.0, "watts"]),
            "samples.1.fields.power_w",
        ),
        (
            lambda s: s[0]["fields"].__setitem__("energy_mj", [1.0, {"x": 1}]),
            "samples.0.fields.energy_mj",
        ),
        (
            lambda s: s[1]["fields"].__setitem__("gpu_util_pct", [[1.0], [2.0]]),
            "samples.1.fields.gpu_util_pct",
        ),
        (lambda s: s[0]["fields"].__setitem__("power_w", [1.0]), "samples.0.fields.power_w"),
        (lambda s: s[0].__setitem__("t", [T0, True]), "samples.0.t"),
        (lambda s: s[1].__setitem__("gpu_index", 1024), "samples.1.gpu_index"),
        (lambda s: s[0].__setitem__("extra", 1), "samples.0.extra"),
    ],
)
def test_parse_rejects_naming_the_field(edit: Any, where: str) -> None:
    body = batch("n1", 1, gpus=2, k=2)
    edit(body["samples"])
    with pytest.raises(IngestRejected) as exc:
        parse_batch(json.dumps(body).encode())
    assert exc.value.status == 422 and exc.value.reason.startswith(where)


def test_duplicates_in_one_group(make_service: Any) -> None:
    svc: ControlService = make_service()
    who = Principal(None, "test", Role.AGENT)

    def item(seq: int) -> IngestItem:
        p = parse_batch(json.dumps(batch("n1", seq, k=3)).encode())
        return IngestItem(p.batch, who, svc.clock(), p.arrays)

    async def together() -> list[Any]:  # same loop iteration: one group, one transaction
        return list(await asyncio.gather(*(svc.ingest.submit(item(s)) for s in (1, 1, 2, 1))))

    acks = asyncio.run(together())
    assert [(a.seq, a.duplicate) for a in acks] == [(1, False), (1, True), (2, False), (1, True)]
    with svc.store.sessions() as s:
        assert s.scalar(select(func.count()).select_from(IngestedBatch)) == 2
    assert svc.store.stats["samples"] == 2 * 2 * 3  # 2 stored batches x 2 GPUs x 3 samples
    # both stored batches carry the same 3 timestamps: 6 ring entries, none from duplicates
    assert svc.store.telemetry.series("n1", 1, ["power_w"])[1]["power_w"] == [101.0] * 6


def test_fast_path_answers_like_the_route(make_service: Any) -> None:
    svc: ControlService = make_service()
    token = svc.store.tokens.create("agent")[0]
    client = TestClient(create_app(svc))
    h = {"Authorization": f"Bearer {token}"}
    r = client.post("/api/v1/ingest", json=batch("n1", 1), headers=h)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"agent_id": "agent-n1", "seq": 1, "duplicate": False}
    direct = asyncio.run(
        handle_ingest(svc, f"Bearer {token}", None, json.dumps(batch("n1", 1)).encode())
    )
    assert direct.status == 200 and json.loads(direct.body)["duplicate"] is True
    bad = asyncio.run(handle_ingest(svc, "Bearer nope", None, b"{}"))
    assert bad.status == 401
    r = client.post("/api/v1/ingest", json=batch("n1", 2), headers={"Authorization": "Basic x"})
    assert r.status_code == 401 and json.loads(bad.body) == r.json()
    # other methods still reach FastAPI (here the static mount at "/", which has no such file)
    assert client.get("/api/v1/ingest", headers=h).status_code == 404


def test_fast_path_and_route_send_the_same_acks(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acknowledged sticky finding the agent still reports rides in ``acks`` alike from the
    ASGI fast path, the FastAPI route (reached under a root path, which the fast path leaves
    alone) and `handle_ingest` itself; before the acknowledgement no ``acks`` key at all."""
    import gpufleet.control.api.app as api_mod
    from gpufleet.control.fleet.actions import acknowledge_finding
    from tests.control.conftest import fail_finding

    real = handle_ingest
    assert vars(api_mod)["handle_ingest"] is real  # the name the FastAPI route calls
    routed: list[int] = []

    async def counting(*a: Any) -> Any:
        routed.append(1)
        return await real(*a)

    monkeypatch.setattr(api_mod, "handle_ingest", counting)
    svc: ControlService = make_service()
    token = svc.store.tokens.create("agent")[0]
    app = create_app(svc)
    fast, route = TestClient(app), TestClient(app, root_path="/gf")
    h = {"Authorization": f"Bearer {token}"}
    f = [fail_finding("n1")]

    def body(seq: int) -> dict[str, Any]:
        return batch("n1", seq, devices=seq == 1, findings=f, health=2)

    def direct(seq: int) -> dict[str, Any]:
        raw = json.dumps(body(seq)).encode()
        reply = asyncio.run(handle_ingest(svc, f"Bearer {token}", None, raw))
        out: dict[str, Any] = json.loads(reply.body)
        return out

    before = [fast.post("/api/v1/ingest", json=body(1), headers=h).json()]
    before.append(route.post("/api/v1/ingest", json=body(2), headers=h).json())
    assert routed == [1]  # the root-path request went through the FastAPI route
    before.append(direct(3))
    assert [sorted(d) for d in before] == [["agent_id", "duplicate", "seq"]] * 3
    fid = next(iter(svc.store.nodes["n1"].findings.values())).id
    acknowledge_finding(svc.store, fid, Principal(1, "alice", Role.OPERATOR))
    a_fast = fast.post("/api/v1/ingest", json=body(4), headers=h).json()
    a_route = route.post("/api/v1/ingest", json=body(5), headers=h).json()
    a_direct = direct(6)
    assert routed == [1, 1]
    assert [d["seq"] for d in (a_fast, a_route, a_direct)] == [4, 5, 6]
    assert a_fast["acks"] == a_route["acks"] == a_direct["acks"]
    assert [(a["code"], a["who"]) for a in a_fast["acks"]] == [("XID_79", "operator:alice")]
