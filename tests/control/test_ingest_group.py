"""Group commit through the whole ingest handler: an answer only once its group's transaction has
committed, one failing batch in a group fails alone (the others keep their acks and their
data), and a queued batch carries its samples as arrays only, with the count and GPU UUIDs the
writer still records.

Expected values are worked out by hand from the batches written in each test."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.control.api.ingest_http import IngestReply, handle_ingest
from gpufleet.control.db.models import Gpu, IngestedBatch, Node
from gpufleet.control.ingest import writes as ingest_writes
from gpufleet.control.ingest.queue import parse_batch, queue_item
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.testing.timescale import scaled
from tests.control.conftest import T0, batch


def _stored(svc: ControlService) -> set[tuple[str, int, int]]:
    """(node, seq, samples) of every batch row, read on a connection of its own."""
    with svc.store.sessions() as s:
        rows = s.execute(select(IngestedBatch.node, IngestedBatch.seq, IngestedBatch.samples))
        return {(n, q, k) for n, q, k in rows}


def _hold(svc: ControlService) -> threading.Event:
    """Hold the writer thread until the returned event is set."""
    gate, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        gate.wait(30)

    svc.store.writer.submit(hold)
    assert held.wait(10)
    return gate


async def _queued(svc: ControlService, n: int) -> None:
    """Until ``n`` batches wait in the writer's queue. (A fixed 0.3 s sleep here once let only
    two of three batches queue on a loaded machine: the third came in a group of its own.)

    ``pending`` counts a batch from the moment its request reaches the writer, but the writer
    receives a loop iteration's batches at the end of that iteration: counting alone once let
    the writer, released at once, take the first handful as a group of their own before the
    last were handed over (CI: an answer saw 3 of 5 batches stored). So this also waits until
    this loop holds back none."""
    loop = asyncio.get_running_loop()
    writer = svc.store.writer
    deadline = time.monotonic() + scaled(10.0)
    while svc.ingest.pending < n or writer._held.get(loop):
        assert time.monotonic() < deadline, f"{svc.ingest.pending} of {n} batches queued"
        await asyncio.sleep(0.01)


def test_answers_come_only_after_the_commit(make_service: Any) -> None:
    """While the writer is held, no request of the group is answered and nothing is stored;
    when an answer arrives its batch is already in the database (read on another
    connection)."""
    svc: ControlService = make_service()
    token = svc.store.tokens.create("agent")[0]
    bodies = [json.dumps(batch(f"n{i}", 1, k=3)).encode() for i in range(5)]
    seen_at_answer: list[set[tuple[str, int, int]]] = []

    async def scenario() -> list[IngestReply]:
        gate = _hold(svc)
        tasks = [
            asyncio.create_task(handle_ingest(svc, f"Bearer {token}", None, b)) for b in bodies
        ]
        for t in tasks:
            t.add_done_callback(lambda _t: seen_at_answer.append(_stored(svc)))
        await _queued(svc, 5)  # parsed and queued; the writer is still held
        assert not any(t.done() for t in tasks)
        assert _stored(svc) == set()
        assert svc.ingest.pending == 5
        gate.set()
        return list(await asyncio.gather(*tasks))

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [200] * 5
    assert [json.loads(r.body)["seq"] for r in replies] == [1] * 5
    want = {(f"n{i}", 1, 2 * 3) for i in range(5)}  # 2 GPUs x 3 samples each
    assert len(seen_at_answer) == 5
    assert all(s == want for s in seen_at_answer)  # every answer: all five were durable
    assert svc.ingest.pending == 0


def test_a_failing_batch_fails_alone(make_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of a group breaks its transaction (a fault injected into the real write);
    the writer retries the group one batch at a time: the others are stored once each and
    acknowledged, the broken one gets its error and leaves no trace."""
    svc: ControlService = make_service()
    token = svc.store.tokens.create("agent")[0]
    real = ingest_writes._apply_one

    def flaky(uow: Any, item: Any, *a: Any) -> None:
        if item.batch.node == "bad":
            raise RuntimeError("injected write failure")
        real(uow, item, *a)

    monkeypatch.setattr(ingest_writes, "_apply_one", flaky)
    nodes = ["a", "bad", "b"]

    async def scenario() -> list[IngestReply | BaseException]:
        gate = _hold(svc)  # all three queue behind the hold: one group
        tasks = [
            asyncio.create_task(
                handle_ingest(svc, f"Bearer {token}", None, json.dumps(batch(n, 7)).encode())
            )
            for n in nodes
        ]
        await _queued(svc, 3)  # all three wait behind the hold: one group
        gate.set()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    groups = len(svc.store.writer.rate)
    ok_a, failed, ok_b = asyncio.run(scenario())
    assert isinstance(failed, RuntimeError) and "injected" in str(failed)
    for r in (ok_a, ok_b):
        assert isinstance(r, IngestReply) and r.status == 200
    answers = [json.loads(r.body) for r in (ok_a, ok_b) if isinstance(r, IngestReply)]
    assert answers == [
        {"agent_id": "agent-a", "seq": 7, "duplicate": False},
        {"agent_id": "agent-b", "seq": 7, "duplicate": False},
    ]
    assert len(svc.store.writer.rate) - groups == 1  # the three went to the writer together
    assert _stored(svc) == {("a", 7, 4), ("b", 7, 4)}  # 2 GPUs x 2 samples; nothing of "bad"
    assert set(svc.store.view.nodes) == {"a", "b"}
    # each good batch's samples reached the rings once: GPU 1's utilization is 10 + i
    for n in ("a", "b"):
        assert svc.store.telemetry.series(n, 1, ["gpu_util_pct"])[1]["gpu_util_pct"] == [
            10.0,
            11.0,
        ]
    assert svc.store.stats["samples"] == 8 and svc.store.stats["batches"] == 2


def test_a_queued_batch_holds_arrays_not_sample_blocks(make_service: Any) -> None:
    """`queue_item` leaves the sample blocks out (they die with the request); the writer
    still records how many samples were sent and registers each GPU with the UUID its first
    block named."""
    svc: ControlService = make_service()
    body = batch("n1", 1, gpus=3, k=4, devices=False)
    body["samples"].append(  # GPU 0 again, one more sample under a second UUID: not registered
        {"gpu_uuid": "GPU-other", "gpu_index": 0, "t": [T0 + 9], "fields": {"power_w": [5.0]}}
    )
    parsed = parse_batch(json.dumps(body).encode(), T0 + 10)
    who = Principal(None, "test", Role.AGENT)
    item = queue_item(parsed, who, T0 + 10)
    assert item.batch.samples == [] and parsed.batch.samples != []
    assert item.sample_count == 3 * 4 + 1
    assert item.block_gpus == ((0, "GPU-n1-0"), (1, "GPU-n1-1"), (2, "GPU-n1-2"))
    ack = svc.ingest.submit_sync(item)
    assert not ack.duplicate
    assert _stored(svc) == {("n1", 1, 13)}
    with svc.store.sessions() as s:
        node_id = s.scalar(select(Node.id).where(Node.name == "n1"))
        gpus = s.execute(select(Gpu.index, Gpu.uuid).where(Gpu.node_id == node_id)).all()
    assert sorted(gpus) == [(0, "GPU-n1-0"), (1, "GPU-n1-1"), (2, "GPU-n1-2")]
    # GPU 2's utilization is 20 + i for i in 0..3, from the arrays alone
    assert svc.store.telemetry.series("n1", 2, ["gpu_util_pct"])[1]["gpu_util_pct"] == [
        20.0,
        21.0,
        22.0,
        23.0,
    ]
