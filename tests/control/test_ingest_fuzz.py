"""A Hypothesis fuzz of ``POST /api/v1/ingest`` (values, timestamps, node names, sizes, raw
bytes): every answer is 200 or a 4xx, never a 5xx; what a 200 stores of the attacked node is
inside the time window and the fields' ranges; a bystander node pushing between the attacks
keeps exactly its own values; and the rollup flush afterwards writes the bystander's minutes."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from gpufleet.control.api.app import create_app
from gpufleet.control.db.models import Rollup
from gpufleet.control.service import ControlService
from gpufleet.control.state.rings import FIELDS
from gpufleet.devices.sim import ManualClock
from gpufleet.wire.limits import MAX_SAMPLES_PER_BLOCK, SAMPLE_AHEAD_S, SAMPLE_RANGES
from tests.control.conftest import batch
from tests.hypothesis_budget import examples

numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(-1e4, 1e4),
    st.sampled_from([-1e30, 1e30, 1e308, -0.0, 2**64, -(2**63), 3.5e38]),
    st.integers(-(2**80), 2**80),
)
json_oddities = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e309", '"5"', "true", "[]"])
names = st.one_of(
    st.text(min_size=0, max_size=12).filter(lambda s: s != "good"),
    st.sampled_from(
        ["a/b", "a b", "x\n", 'q"', "gpu[001-128]", "a,b", "", "n" * 254, "..", "ok-1"]
    ),
)


@st.composite
def attacks(draw: st.DrawFn, now: float) -> tuple[bytes, dict[str, str]]:
    """One hostile push for node "victim" (a JSON body and its extra headers)."""
    body: dict[str, Any] = batch("victim", 1, t=now, gpus=2, k=3, devices=False)
    block = body["samples"][draw(st.integers(0, 1))]
    what = draw(st.sampled_from(["value", "time", "name", "size", "oddity", "bytes", "gzip"]))
    if what == "value":
        field = draw(st.sampled_from(FIELDS))
        block["fields"][field] = [draw(numbers) for _ in range(3)]
    elif what == "time":
        block["t"][draw(st.integers(0, 2))] = draw(numbers)
    elif what == "name":
        body["node"] = draw(names)
    elif what == "size":
        n = draw(st.sampled_from([MAX_SAMPLES_PER_BLOCK, MAX_SAMPLES_PER_BLOCK + 1, 20_000]))
        block["t"] = [now - n + i for i in range(n)]
        block["fields"] = {"power_w": [draw(numbers)] * n}
    raw = json.dumps(body).encode()
    if what == "oddity":  # a JSON extension or wrong type where a reading goes
        raw = raw.replace(
            b'"power_w": [', b'"power_w": [' + draw(json_oddities).encode() + b", ", 1
        )
        raw = raw.replace(b"100.0, 100.0, 100.0]", b"100.0, 100.0]", 1)
    if what == "bytes":
        return draw(st.binary(max_size=200)), {}
    if what == "gzip":
        return gzip.compress(raw)[: draw(st.integers(0, 200))], {"Content-Encoding": "gzip"}
    return raw, {}


def test_fuzzed_ingest_never_fails_and_never_touches_another_node(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service()
    client = TestClient(create_app(svc))
    agent = {"Authorization": f"Bearer {svc.store.tokens.create('agent')[0]}"}
    seq = itertools.count(1)
    answers: set[int] = set()

    @settings(
        max_examples=examples(150),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def attack(data: st.DataObject) -> None:
        now = clock.advance(1.0)
        n = next(seq)
        good = batch("good", n, t=now, gpus=2, k=1, devices=n == 1)
        good["samples"][0]["fields"]["power_w"] = [float(n % 500)]
        assert client.post("/api/v1/ingest", json=good, headers=agent).status_code == 200
        raw, extra = data.draw(attacks(now))
        raw = raw.replace(b'"seq": 1,', f'"seq": {n},'.encode(), 1)
        r = client.post("/api/v1/ingest", content=raw, headers={**agent, **extra})
        answers.add(r.status_code)
        assert r.status_code in (200, 400, 413, 415, 422), (r.status_code, r.text)
        t, latest = svc.store.telemetry.latest("good", 0)
        assert (t, latest["power_w"]) == (now, float(n % 500))  # the bystander, untouched
        if r.status_code == 200:
            vt, values = svc.store.telemetry.latest("victim", 0)
            assert vt is None or vt <= now + SAMPLE_AHEAD_S
            for name, v in values.items():
                lo, hi = SAMPLE_RANGES[name]
                assert v is None or lo <= v <= hi, (name, v)

    attack()
    assert 200 in answers and 422 in answers  # the fuzz reached both sides
    clock.advance(600)
    svc.flush_rollups()
    with svc.store.sessions() as s:
        nodes = {r.node for r in s.scalars(select(Rollup))}
    assert "good" in nodes
