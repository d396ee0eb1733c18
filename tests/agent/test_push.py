"""Pushing to the control plane: a real loopback ingest server (per wire.py's docstring),
buffering while it is unreachable, in-order replay, no duplicates, seq across a restart."""

from __future__ import annotations

import gzip
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.push import Pusher, backoff_s
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.spool import AgentState, Spool
from gpufleet.devices.sim import Fault, FaultKind, ManualClock
from gpufleet.wire import Ack, Batch
from tests.agent.conftest import sim_node

TOKEN = "t0ken"


class Ingest:
    """A minimal control plane: POST /api/v1/ingest, bearer token, (agent_id, seq) stored once."""

    def __init__(self, port: int = 0) -> None:
        self.received: list[Batch] = []  # every request body, in arrival order
        self.stored: dict[tuple[str, int], Batch] = {}
        ingest = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                if self.path != "/api/v1/ingest":
                    self.send_error(404)
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_error(401)
                    return
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                try:
                    batch = Batch.model_validate_json(raw)
                except ValueError as exc:
                    self.send_error(422, str(exc)[:100])
                    return
                ingest.received.append(batch)
                key = (batch.agent_id, batch.seq)
                dup = key in ingest.stored
                ingest.stored.setdefault(key, batch)
                body = Ack(agent_id=batch.agent_id, seq=batch.seq, duplicate=dup)
                data = body.model_dump_json().encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.httpd.server_address[1])
        self._t = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._t.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def ingest() -> Iterator[Ingest]:
    srv = Ingest()
    yield srv
    srv.stop()


def _agent(url: str, state: Path, clock: ManualClock, node: object, **kw: object) -> Agent:
    cfg = AgentConfig(controller=url, token=TOKEN, state_dir=state, **kw)  # type: ignore[arg-type]
    return Agent(node.backend(), cfg, clock=clock)  # type: ignore[attr-defined]


def _round(agent: Agent, clock: ManualClock, seconds: float = 5.0) -> None:
    for _ in range(int(seconds)):
        agent.tick()
        clock.advance(1)
    agent.push_once()


@pytest.mark.process
def test_push_offline_buffer_replay_and_restart(ingest: Ingest, tmp_path: Path) -> None:
    clock = ManualClock()
    fleet, node = sim_node("1x2xh100", clock)
    fleet.inject(Fault(FaultKind.XID, gpu=1, at_s=2.5, params={"xid": 13}))
    url = f"http://127.0.0.1:{ingest.port}"
    a = _agent(url, tmp_path, clock, node)
    _round(a, clock)
    assert [b.seq for b in ingest.received] == [1]
    first = ingest.received[0]
    assert first.devices is not None and len(first.devices) == 2  # identities on the first batch
    assert first.events and first.events[0].xid == 13
    assert sum(len(s.t) for s in first.samples if s.gpu_index == 0) == 5 + 1  # 5 fast + 1 slow
    port = ingest.port
    ingest.stop()  # the control plane goes away: connection refused
    for _ in range(3):
        _round(a, clock, 70)  # past any backoff
    assert len(a.pusher.spool) == 3  # type: ignore[union-attr]
    a.close()

    b = _agent(url, tmp_path, clock, node)  # the agent restarts, still offline
    assert b.state is not None and b.state.agent_id == first.agent_id
    _round(b, clock, 70)
    assert b.pusher is not None and b.pusher.spool.seqs() == [2, 3, 4, 5]  # seq survived

    back = Ingest(port)  # the control plane returns on the same address
    try:
        _round(b, clock, 70)
        seqs = [x.seq for x in back.received]
        assert seqs == [2, 3, 4, 5, 6]  # replayed in order, then the new one
        assert all(x.buffered for x in back.received[:4])  # they came from the disk spool
        assert Counter(seqs).most_common(1)[0][1] == 1  # nothing sent twice
        assert len(b.pusher.spool) == 0
        _round(b, clock)
        assert [x.seq for x in back.received][-1] == 7 and len(back.received) == 6
        assert not back.received[-1].buffered  # online again: sent directly
    finally:
        back.stop()
        b.close()


def test_retry_after_429_and_reject_400(tmp_path: Path) -> None:
    clock = ManualClock()
    _fleet, node = sim_node("1x1xh100", clock)
    answers = [429, 200, 400, 200]
    seen: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seq = json.loads(gzip.decompress(req.content))["seq"]
        seen.append(seq)
        code = answers.pop(0)
        if code == 429:
            return httpx.Response(429, headers={"Retry-After": "30"})
        if code == 400:
            return httpx.Response(400, text="bad")
        return httpx.Response(200, json={"agent_id": "x", "seq": seq})

    cfg = AgentConfig(controller="http://cp.invalid", token=TOKEN, state_dir=tmp_path)
    a = Agent(node.backend(), cfg, clock=clock, transport=httpx.MockTransport(handler))
    assert a.pusher is not None
    _round(a, clock)  # seq 1 -> 429, Retry-After 30 s
    assert seen == [1] and a.pusher.spool.seqs() == [1]
    _round(a, clock, 10)  # 10 s later: still inside Retry-After, nothing sent
    assert seen == [1] and a.pusher.spool.seqs() == [1, 2]
    _round(a, clock, 25)  # past it: 1 acked, 2 rejected (400, dropped), 3 acked
    assert seen == [1, 1, 2, 3] and len(a.pusher.spool) == 0
    assert a.pusher.stats.rejected == 1 and a.pusher.stats.acked == 2
    a.close()


def test_spool_is_bounded_drop_oldest(tmp_path: Path) -> None:
    clock = ManualClock()
    _fleet, node = sim_node("1x1xh100", clock)

    def down(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    cfg = AgentConfig(
        controller="http://cp.invalid", token=TOKEN, state_dir=tmp_path, spool_max_batches=3
    )
    a = Agent(node.backend(), cfg, clock=clock, transport=httpx.MockTransport(down))
    for _ in range(5):
        _round(a, clock, 2)
    assert a.pusher is not None
    assert a.pusher.spool.seqs() == [3, 4, 5] and a.pusher.spool.dropped == 2
    text = a.render_metrics().decode()
    assert 'gpufleet_agent_buffer_depth{Hostname="sim-00",buffer="spool"} 3' in text
    assert 'gpufleet_agent_spool_dropped_total{Hostname="sim-00"} 2' in text
    a.close()


def test_backoff_is_full_jitter_under_a_cap() -> None:
    almost_one = 1.0 - 1e-9  # rng() is uniform in [0, 1): its top is the whole bound
    # base 0.5 s doubling per failure, capped at 5 s
    assert [backoff_s(n, lambda: almost_one) for n in range(7)] == pytest.approx(
        [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    )
    assert backoff_s(3, lambda: 0.0) == 0.0  # full jitter: anywhere down to no wait at all
    assert backoff_s(3, lambda: 0.25) == pytest.approx(1.0)  # a quarter of the 4 s bound
    assert backoff_s(10_000, lambda: 0.5) == pytest.approx(2.5)  # huge exponent: still capped
    assert backoff_s(6, lambda: 0.5, cap_s=1.0) == pytest.approx(0.5)


def test_retries_jitter_then_contact_resumes_within_the_cap(tmp_path: Path) -> None:
    clock = ManualClock()
    up = False
    sent: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if not up:
            raise httpx.ConnectError("refused", request=req)
        seq = json.loads(gzip.decompress(req.content))["seq"]
        sent.append(seq)
        return httpx.Response(200, json={"agent_id": "x", "seq": seq})

    draws = iter([0.5, 0.1, 0.9, 0.75, 0.6, 0.99, 0.3, 0.2])
    state = AgentState(tmp_path, "n1")
    pusher = Pusher(
        "http://cp.invalid",
        TOKEN,
        state,
        Spool(tmp_path / "spool"),
        transport=httpx.MockTransport(handler),
        clock=clock,
        rng=lambda: next(draws),
    )

    def build(seq: int) -> Batch:
        return Batch(node="n1", agent_id=state.agent_id, seq=seq, sent_at_s=clock())

    waits = []
    for _ in range(8):
        clock.advance(max(0.0, pusher.retry_at - clock()))  # push once the wait is over
        pusher.push(build)
        waits.append(pusher.retry_at - clock())
    # each wait is the draw times min(5 s, 0.5 s * 2**failures)
    expected = [0.5 * 0.5, 0.1 * 1, 0.9 * 2, 0.75 * 4, 0.6 * 5, 0.99 * 5, 0.3 * 5, 0.2 * 5]
    assert waits == pytest.approx(expected)
    assert len(pusher.spool) == 8 and sent == []
    up = True  # the control plane returns: the agent is back within the 5 s cap
    assert pusher.retry_at - clock() <= 5.0
    clock.advance(pusher.retry_at - clock())
    pusher.push(build)
    assert sent == list(range(1, 10)) and len(pusher.spool) == 0
    assert pusher.failures == 0 and pusher.retry_at == 0.0
    pusher.close()
