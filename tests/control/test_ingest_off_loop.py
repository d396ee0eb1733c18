"""A batch at the wire limits (16 GPUs x 2 tiers x 3600 rows, about 5 MB of JSON) is decoded
and validated off the controller's event loop: while `_parse` takes it in, other coroutines on
the same loop keep running (before, a 716k-sample batch held the loop for 1.9 s and every other
request waited); a small batch is still parsed inline, without a thread hop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from gpufleet.control.api.ingest_http import OFF_LOOP_BYTES, _parse
from gpufleet.wire.limits import MAX_GPUS_PER_NODE, MAX_SAMPLES_PER_BLOCK
from tests.control.conftest import batch


def full_batch(seq: int) -> bytes:
    t0 = time.time() - 2 * MAX_SAMPLES_PER_BLOCK
    rows = range(MAX_SAMPLES_PER_BLOCK)
    samples: list[dict[str, Any]] = [
        {
            "gpu_uuid": f"GPU-{g}",
            "gpu_index": g,
            "t": [t0 + (tier + 1) * i for i in rows],
            "fields": {
                name: [100.0 + (i % 7) for i in rows]
                for name in ("power_w", "gpu_util_pct", "gpu_temp_c", "sm_clock_mhz")
            },
        }
        for tier in range(2)
        for g in range(MAX_GPUS_PER_NODE)
    ]
    body = {
        "schema_version": 1,
        "node": "big",
        "agent_id": "a-big",
        "seq": seq,
        "sent_at_s": t0,
        "samples": samples,
    }
    return orjson.dumps(body)


async def _ticks_during(body: bytes) -> tuple[int, Any]:
    ticks = 0
    stop = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)  # the ticker runs
    before = ticks
    parsed = await _parse(body, None, time.time())
    during = ticks - before
    stop.set()
    await ticker
    return during, parsed


def test_a_full_batch_is_parsed_while_the_loop_runs_on() -> None:
    body = full_batch(1)
    assert len(body) > OFF_LOOP_BYTES
    during, parsed = asyncio.run(_ticks_during(body))
    assert len(parsed.batch.samples) == 2 * MAX_GPUS_PER_NODE
    assert during > 0  # the loop ran other work while the batch was parsed


def test_a_small_batch_is_parsed_inline() -> None:
    body = orjson.dumps(batch("n1", 1))
    assert len(body) <= OFF_LOOP_BYTES
    during, parsed = asyncio.run(_ticks_during(body))
    assert parsed.batch.node == "n1"
    assert during == 0  # no await inside: nothing else ran meanwhile
