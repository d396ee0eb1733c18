"""A control plane older than the agent (issue 29): its 422 naming ``field: schema_version``
with an older ``schema_version_supported`` keeps the batches (one log line, counted, a longer
retry cap) until it accepts them; every other 400/413/422 still drops the batch. The process
test with a real controller is `tests/integration/test_newer_agent_spool.py`."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.push import OLDER_BACKOFF_FACTOR, Pusher
from gpufleet.agent.spool import AgentState, Spool
from gpufleet.devices.sim import ManualClock
from gpufleet.wire import SCHEMA_VERSION, Batch

OLDER = {
    "detail": "schema_version: 2 is newer than this control plane knows (1): upgrade ...",
    "field": "schema_version",
    "schema_version_supported": SCHEMA_VERSION - 1,  # older than this code
}


class Plane:
    """A control plane answering ``refusal`` (a 422 body) until ``upgrade()``, then acks."""

    def __init__(self, refusal: dict[str, Any]) -> None:
        self.refusal = refusal
        self.upgraded = False
        self.seen: list[int] = []

    def upgrade(self) -> None:
        self.upgraded = True

    def __call__(self, req: httpx.Request) -> httpx.Response:
        seq = json.loads(gzip.decompress(req.content))["seq"]
        self.seen.append(seq)
        if not self.upgraded:
            return httpx.Response(422, json=self.refusal)
        return httpx.Response(200, json={"agent_id": "x", "seq": seq})


def pusher_for(tmp: Path, plane: Plane, clock: ManualClock) -> tuple[Pusher, AgentState]:
    state = AgentState(tmp, "n1")
    pusher = Pusher(
        "http://cp.invalid",
        "t0ken",
        state,
        Spool(tmp / "spool"),
        transport=httpx.MockTransport(plane),
        clock=clock,
        rng=lambda: 1.0 - 1e-9,  # the top of every backoff bound
        max_backoff_s=2.0,
    )
    return pusher, state


def push_rounds(pusher: Pusher, state: AgentState, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        clock.advance(max(1.0, pusher.retry_at - clock()))
        pusher.push(lambda seq: Batch(node="n1", agent_id=state.agent_id, seq=seq, sent_at_s=0))


def test_an_older_control_plane_keeps_the_batches_until_it_accepts_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    plane = Plane(OLDER)
    pusher, state = pusher_for(tmp_path, plane, clock)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.push"):
        push_rounds(pusher, state, clock, 8)
    assert pusher.spool.seqs() == list(range(1, 9))  # every one kept, none dropped
    assert pusher.stats.rejected == 0 and pusher.stats.schema_refused == 8
    assert pusher.older_control_plane == SCHEMA_VERSION - 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # one line, not one per batch or retry
    assert lines[0].startswith(
        f"the control plane speaks wire schema {SCHEMA_VERSION - 1}, this agent {SCHEMA_VERSION}"
    )
    # the retry waits grow to the longer cap: 12 x the usual 2 s
    assert pusher.retry_at - clock() == pytest.approx(2.0 * OLDER_BACKOFF_FACTOR)
    plane.upgrade()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.push"):
        push_rounds(pusher, state, clock, 1)
    assert len(pusher.spool) == 0 and pusher.older_control_plane is None
    assert plane.seen[-9:] == list(range(1, 10))  # in order, then the new one
    assert [r.getMessage() for r in caplog.records] == [
        f"the control plane accepts this agent's wire schema ({SCHEMA_VERSION}) now: "
        "delivering the 9 kept batch(es) in order"  # the 8 and the new one
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"detail": "heartbeat_interval_s: too small", "field": "heartbeat_interval_s"},
        {**OLDER, "schema_version_supported": SCHEMA_VERSION},  # not older: this batch is bad
        {**OLDER, "schema_version_supported": "0"},
        {"detail": OLDER["detail"]},  # the sentence alone is not read
    ],
    ids=["other-field", "same-schema", "not-a-number", "text-only"],
)
def test_other_422s_still_drop_the_batch(tmp_path: Path, body: dict[str, Any]) -> None:
    clock = ManualClock()
    pusher, state = pusher_for(tmp_path, Plane(body), clock)
    push_rounds(pusher, state, clock, 3)
    assert len(pusher.spool) == 0 and pusher.stats.rejected == 3
    assert pusher.stats.schema_refused == 0 and pusher.older_control_plane is None
