"""Forwarded raw series reads between replicas (issue 18), in process: ``--advertise-url``
checks (the option and its environment variable, through the real CLI), the holder recorded
with a node's throttled heartbeat write on a real PostgreSQL (no write of its own per batch),
minute rollups shared by every replica through the database, and the forwarder's answers when
the holder answers, fails or is this replica (httpx's mock transport stands in for a peer;
`tests/integration/test_ha_series.py` runs real replicas)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from gpufleet.control.db.models import Node
from gpufleet.control.series import memory
from gpufleet.control.series.forward import (
    FORWARDED,
    PeerAnswered,
    SeriesForwarder,
    check_advertise_url,
)
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.store import ControlStore
from gpufleet.devices.sim import ManualClock
from gpufleet.errors import UsageError
from gpufleet.wire import views as sc

from .conftest import T0, _reset_pg, batch, push, ungated

A, B = "http://10.0.0.1:8080", "http://10.0.0.2:8080"


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("http://10.0.0.1:8080", "http://10.0.0.1:8080"),
        ("https://ctl-0.ctl.svc:8443/", "https://ctl-0.ctl.svc:8443"),
        ("http://[fd00::1]:8080", "http://[fd00::1]:8080"),
        ("http://fd00::1:8080", "http://[fd00::1]:8080"),  # Kubernetes' $(POD_IP) on IPv6
    ],
)
def test_advertise_url_accepted(given: str, want: str) -> None:
    assert check_advertise_url(given) == want


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("10.0.0.1:8080", "expected http(s)://HOST:PORT"),
        ("ftp://h:21", "expected http(s)://HOST:PORT"),
        ("http://h:80x", "port is not a number"),
        ("http://u:p@h:8080", "no user:password"),
        ("http://h:8080/api/v1", "no path"),
        ("http://0.0.0.0:8080", "not an address peers can reach"),
        ("http://[::]:8080", "not an address peers can reach"),
    ],
)
def test_advertise_url_refused_with_a_clear_error(given: str, why: str) -> None:
    with pytest.raises(UsageError, match="--advertise-url") as err:
        check_advertise_url(given)
    assert why in str(err.value)


@pytest.mark.parametrize("how", ["option", "env"])
@pytest.mark.process
def test_the_controller_refuses_a_bad_advertise_url_before_starting(
    how: str, tmp_path: Any
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    args = [sys.executable, "-m", "gpufleet", "controller", "--data-dir", str(tmp_path)]
    if how == "option":
        args += ["--advertise-url", "http://0.0.0.0:8080"]
    else:
        env["GPUFLEET_ADVERTISE_URL"] = "http://0.0.0.0:8080"
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "--advertise-url 'http://0.0.0.0:8080'" in out and "Traceback" not in out
    assert not list(tmp_path.glob("*.db"))  # refused before the database was opened


@pytest.fixture
def pair(pg_url: str) -> Iterator[tuple[ControlService, ControlService]]:
    _reset_pg(pg_url)
    clock = ManualClock(T0)
    made = []
    for url in (A, B):
        cfg = ServiceConfig(
            db_url=pg_url,
            policy=ungated(None),
            lease_s=2.0,
            renew_s=0.2,
            advertise_url=url,
            tick_s=3600.0,  # no loop passes of their own: the test ticks
        )
        made.append(ControlService(cfg, clock=clock))
    for s in made:
        s.start()
    try:
        yield made[0], made[1]
    finally:
        for s in made:
            s.stop()


def _holder(svc: ControlService, node: str) -> str | None:
    return SeriesForwarder.holder(svc.store, node)


@pytest.mark.process
def test_the_holder_rides_on_the_throttled_heartbeat_write(
    pair: tuple[ControlService, ControlService],
) -> None:
    a, b = pair
    clock = a.clock
    assert isinstance(clock, ManualClock)
    push(a, batch("n1", 1, t=T0))
    assert _holder(a, "n1") == A  # the node's first row names the replica that ingested it
    with a.store.sessions.begin() as s:  # a marker: only a write of the row replaces it
        s.execute(update(Node).where(Node.name == "n1").values(rings_url="marker"))
    clock.advance(0.5)
    push(a, batch("n1", 2, t=clock()))
    assert _holder(a, "n1") == "marker"  # within the throttle: no write of its own
    clock.advance(0.6)
    push(a, batch("n1", 3, t=clock()))
    assert _holder(a, "n1") == A  # the heartbeat write (at most every second) carries it
    b.tick()  # b knows the node
    push(b, batch("n1", 4, t=clock()))  # the agent failed over: b holds its newest samples
    assert _holder(b, "n1") == B
    with a.store.sessions() as s:
        seen = s.scalar(select(Node.last_seen_s).where(Node.name == "n1"))
    assert seen == clock()  # the same write as the heartbeat
    clock.advance(1.1)  # and back to a, whose cache still says A: the heartbeat carries it
    push(a, batch("n1", 5, t=clock()))
    assert _holder(a, "n1") == A


def test_minutes_are_shared_through_the_database(
    pair: tuple[ControlService, ControlService],
) -> None:
    """Only raw reads are forwarded: a replica's closed minutes go to the rollup table, which
    every replica reads."""
    a, b = pair
    push(a, batch("n1", 1, t=T0, k=30))
    a.flush_rollups(everything=True)
    b.tick()
    names = ["power_w", "gpu_util_pct"]
    got = [
        memory.series(
            s.store, s.store.view.nodes["n1"], 0, names, resolution="minute", since_s=None
        )
        for s in (a, b)
    ]
    assert got[0].t and got[0].t == got[1].t
    assert got[0].fields == got[1].fields and got[0].max == got[1].max
    raw_b = memory.series(
        b.store, b.store.view.nodes["n1"], 0, names, resolution="raw", since_s=None
    )
    assert raw_b.t == []  # raw samples: only in a's memory


# -- the forwarder against a stand-in peer -----------------------------------------------------
def _series(t: list[float]) -> sc.Series:
    return sc.Series(node="n1", gpu=0, resolution="raw", t=t, fields={"power_w": [1.0] * len(t)})


class _Fixed(SeriesForwarder):
    """The holder as given (no database)."""

    def __init__(self, own: str | None, holder: str | None, **kw: Any) -> None:
        super().__init__(own, **kw)
        self._holder = holder

    def holder(self, store: ControlStore, node: str) -> str | None:  # type: ignore[override]
        return self._holder


def _read(fw: SeriesForwarder, headers: dict[str, str] | None = None) -> sc.Series:
    store: Any = None  # unused by _Fixed
    return fw.read(
        store,
        "n1",
        path="/api/v1/nodes/n1/gpus/0/series",
        query="fields=power_w",
        headers={"authorization": "Bearer gf_caller", **(headers or {})},
        local=lambda: _series([]),
    )


def _peer(
    answer: Callable[[httpx.Request], httpx.Response],
) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return answer(req)

    return httpx.MockTransport(handler), seen


def test_forwarded_to_the_holder_with_the_callers_token_and_the_forwarded_header() -> None:
    transport, seen = _peer(lambda r: httpx.Response(200, json=_series([1.0, 2.0]).model_dump()))
    doc = _read(_Fixed(B, A, transport=transport))
    assert doc.t == [1.0, 2.0] and doc.source == "peer" and doc.served_by == A
    assert not doc.partial
    (req,) = seen
    assert str(req.url) == f"{A}/api/v1/nodes/n1/gpus/0/series?fields=power_w"
    assert req.headers["authorization"] == "Bearer gf_caller" and req.headers[FORWARDED] == "1"


def test_answered_locally_when_forwarded_or_own_and_no_request_made() -> None:
    transport, seen = _peer(lambda r: httpx.Response(500))
    fw = _Fixed(B, A, transport=transport)
    doc = _read(fw, {FORWARDED: "1"})  # a peer asks: this replica's memory, no loop
    assert doc.source == "memory" and doc.served_by == B and not doc.partial
    doc = _read(_Fixed(A, A, transport=transport))  # the holder is this replica
    assert doc.source == "memory" and not doc.partial
    assert seen == []


def test_no_holder_recorded_is_said() -> None:
    doc = _read(_Fixed(B, None))
    assert doc.partial and doc.note is not None and "--advertise-url" in doc.note


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda r: httpx.Response(503, text="stopping"), "HTTP 503"),
        (lambda r: httpx.Response(200, text="<html>"), "not a series"),
        (lambda r: httpx.Response(200, json={"t": "x"}), "not a series"),
    ],
)
def test_a_failing_holder_leaves_the_local_answer_marked_partial(
    answer: Callable[[httpx.Request], httpx.Response], why: str
) -> None:
    transport, _ = _peer(answer)
    doc = _read(_Fixed(B, A, transport=transport))
    assert doc.t == [] and doc.partial and doc.source == "memory"
    assert doc.note is not None and A in doc.note and why in doc.note


def test_a_holder_that_failed_is_not_asked_again_for_a_while() -> None:
    now = [100.0]
    up = [False]

    def answer(r: httpx.Request) -> httpx.Response:
        if not up[0]:
            raise httpx.ConnectError("refused", request=r)
        return httpx.Response(200, json=_series([5.0]).model_dump())

    transport, seen = _peer(answer)
    fw = _Fixed(B, A, transport=transport, down_s=5.0, clock=lambda: now[0])
    assert _read(fw).partial and len(seen) == 1
    now[0] += 2.0
    doc = _read(fw)
    assert doc.partial and len(seen) == 1 and doc.note is not None and "2 s ago" in doc.note
    up[0] = True
    now[0] += 4.0  # past down_s: asked again, and it answers
    doc = _read(fw)
    assert len(seen) == 2 and doc.t == [5.0] and not doc.partial and fw.forwarded == 1


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (404, {"detail": "node n1 has no GPU 99"}, "node n1 has no GPU 99"),
        (422, {"detail": [{"loc": ["query", "since_s"]}]}, '"since_s"'),
        (403, None, "forbidden"),
    ],
)
def test_a_holders_refusal_is_passed_on_and_the_holder_stays_up(
    status: int, body: Any, detail: str
) -> None:
    # the issue-29 finding: a viewer asking for GPU 99 made the holder answer 404, and this
    # replica then took the holder for down 5 s, so every user's recent charts read partial
    now = [100.0]
    answers = [
        httpx.Response(status, json=body) if body else httpx.Response(status, text="forbidden"),
        httpx.Response(200, json=_series([7.0]).model_dump()),
    ]
    transport, seen = _peer(lambda r: answers[len(seen) - 1])
    fw = _Fixed(B, A, transport=transport, down_s=5.0, clock=lambda: now[0])
    with pytest.raises(PeerAnswered) as refused:
        _read(fw)
    assert refused.value.status == status and detail in refused.value.detail
    now[0] += 1.0  # well within down_s
    doc = _read(fw)
    assert len(seen) == 2 and doc.t == [7.0] and doc.source == "peer" and not doc.partial
    assert fw.failed == 0


@pytest.mark.parametrize("what", ["missing", "not-pem"])
@pytest.mark.process
def test_the_controller_refuses_a_bad_peer_ca_before_starting(what: str, tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    ca = tmp_path / "peers.pem"
    if what == "not-pem":
        ca.write_text("not a certificate\n", encoding="utf-8")
    data = tmp_path / "data"
    args = [sys.executable, "-m", "gpufleet", "controller", "--data-dir", str(data)]
    r = subprocess.run(
        [*args, "--peer-ca", str(ca)], capture_output=True, text=True, env=env, timeout=120
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"--peer-ca {ca}" in out and "Traceback" not in out
    want = "no such file" if what == "missing" else "not a PEM certificate bundle"
    assert want in out
    assert not list(data.glob("*.db"))  # refused before the database was opened
