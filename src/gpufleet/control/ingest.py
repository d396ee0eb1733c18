"""Ingest: decode a pushed batch (gzip, size limits, the `gpufleet.wire.Batch` model), then
commit it through a single writer thread that groups concurrent batches into one transaction
(group commit).

A request's future resolves only after its group's transaction has committed, so an ``Ack``
always means durable. When the queue holds more than ``max_pending`` batches the endpoint
answers 429 with ``Retry-After`` instead of queueing more.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from pydantic import ValidationError

from gpufleet.control.store import ControlStore, IngestItem
from gpufleet.control.telemetry_store import FIELDS, NF, SampleGroup, clean_matrix
from gpufleet.wire import MAX_BATCH_BYTES, Ack, Batch, WireSamples
from gpufleet.wire.problems import reason

log = logging.getLogger("gpufleet.control.ingest")


class IngestRejected(Exception):
    """A batch refused before it was queued: ``status`` is the HTTP status, ``reason`` why."""

    def __init__(self, status: int, reason: str, retry_after_s: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


def decode_body(body: bytes, content_encoding: str | None) -> bytes:
    """The uncompressed JSON body; 413 past MAX_BATCH_BYTES, 400 on a broken gzip stream."""
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        if len(body) > MAX_BATCH_BYTES:
            raise IngestRejected(413, f"batch is {len(body)} bytes; the limit is {MAX_BATCH_BYTES}")
        return body
    if enc != "gzip":
        raise IngestRejected(415, f"Content-Encoding {enc!r}: only gzip or identity")
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, MAX_BATCH_BYTES + 1)
    except zlib.error as exc:
        raise IngestRejected(400, f"body is not valid gzip: {exc}") from exc
    if len(out) > MAX_BATCH_BYTES or d.unconsumed_tail:
        raise IngestRejected(413, f"batch inflates past the {MAX_BATCH_BYTES}-byte limit")
    if not d.eof:
        raise IngestRejected(400, "body is a truncated gzip stream")
    return out


@dataclass(frozen=True)
class Parsed:
    """A validated batch and its samples as arrays (groups of GPUs with equal sample counts)."""

    batch: Batch
    arrays: list[SampleGroup]


@dataclass
class _Group:
    gpus: list[int] = field(default_factory=list)
    ts: list[Any] = field(default_factory=list)
    flat: list[Any] = field(default_factory=list)  # kept metrics, FIELDS order, block by block


def sample_arrays(samples: list[WireSamples]) -> list[SampleGroup]:
    """Validated samples as arrays for the telemetry store: one numpy conversion per group of
    GPUs with the same sample count (a GPU seen twice starts a new group); metrics the store
    does not keep are dropped."""
    groups: dict[int, list[_Group]] = {}
    for s in samples:
        k = len(s.t)
        if k == 0:
            continue
        runs = groups.setdefault(k, [])
        if not runs or s.gpu_index in runs[-1].gpus:
            runs.append(_Group())
        grp = runs[-1]
        grp.gpus.append(s.gpu_index)
        grp.ts.append(s.t)
        none_row = [None] * k
        get = s.fields.get
        grp.flat.extend(chain.from_iterable([get(name) or none_row for name in FIELDS]))
    arrays = []
    for k, runs in groups.items():
        for grp in runs:
            mat = np.array(grp.flat, dtype=np.float64).reshape(len(grp.gpus), NF, k)
            tarr = np.array(grp.ts, dtype=np.float64)
            arrays.append(SampleGroup(grp.gpus, tarr, clean_matrix(mat)))
    return arrays


def parse_batch(raw: bytes) -> Parsed:
    """Validate against the wire contract, `Batch` itself (pydantic's JSON validation, measured
    faster than the hand-written parser it replaced: ``benchmarks/parse_batch.py``); 422 with
    the first problem's field path and message."""
    try:
        batch = Batch.model_validate_json(raw)
    except ValidationError as exc:
        raise IngestRejected(422, reason(exc)) from exc
    if b"\\u0000" in raw:  # also inside free-form mappings (evidence, device info)
        raise IngestRejected(422, "strings must not contain NUL characters")
    return Parsed(batch, sample_arrays(batch.samples))


@dataclass
class _Pending:
    item: IngestItem
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[Ack] | None
    done: threading.Event | None = None
    result: Ack | BaseException | None = None


class IngestQueue:
    """The single writer: drains the queue in groups of up to ``max_group`` batches."""

    def __init__(
        self, store: ControlStore, *, max_pending: int = 2000, max_group: int = 256
    ) -> None:
        self.store = store
        self.max_pending = max_pending
        self.max_group = max_group
        self._q: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._rate: deque[tuple[float, int]] = deque(maxlen=64)
        self.latencies_ms: deque[float] = deque(maxlen=50_000)
        self._inloop: list[_Pending] = []
        self._flush_scheduled = False

    def start(self) -> None:
        import sys

        sys.setswitchinterval(0.0002)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpufleet-ingest", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def pending(self) -> int:
        return self._q.qsize() + len(self._inloop)

    def retry_after_s(self) -> int:
        """How long to wait, from the recent commit rate (at least 1 s)."""
        if len(self._rate) >= 2:
            span = self._rate[-1][0] - self._rate[0][0]
            done = sum(n for _, n in self._rate)
            if span > 0 and done:
                return max(1, math.ceil(self.pending / (done / span)))
        return 1

    def check_capacity(self, node: str) -> None:
        if self.pending >= self.max_pending:
            self.store.touch(node, self.store.clock())
            raise IngestRejected(
                429, f"ingest queue full ({self.pending} batches waiting)", self.retry_after_s()
            )

    async def submit(self, item: IngestItem) -> Ack:
        """Queue one batch and wait until its group is committed.

        Groups are committed on the event loop itself, once per loop iteration, with every
        batch that arrived in it: no thread hand-off per request (on a 2-core machine the GIL
        hand-offs between a writer thread and the loop cost more than the commit)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Ack] = loop.create_future()
        self._inloop.append(_Pending(item, loop, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_inloop)
        return await fut

    def _flush_inloop(self) -> None:
        self._flush_scheduled = False
        group, self._inloop = self._inloop, []
        for i in range(0, len(group), self.max_group):
            self._commit(group[i : i + self.max_group])

    def submit_sync(self, item: IngestItem, timeout_s: float = 60.0) -> Ack:
        """The same from a plain thread (in-process agents, tests)."""
        p = _Pending(item, None, None, threading.Event())
        self._q.put(p)
        assert p.done is not None
        if not p.done.wait(timeout_s):
            raise TimeoutError("ingest did not commit in time")
        if isinstance(p.result, BaseException):
            raise p.result
        assert isinstance(p.result, Ack)
        return p.result

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < self.max_group:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Pending]) -> None:
        t0 = time.monotonic()
        results: list[Ack | BaseException]
        try:
            results = list(self.store.apply_batches([p.item for p in group]))
        except Exception as exc:  # a broken group: retry one by one so one bad batch fails
            log.warning("group commit of %d batches failed (%s); retrying singly", len(group), exc)
            results = []
            for p in group:
                try:
                    results.extend(self.store.apply_batches([p.item]))
                except Exception as exc1:
                    results.append(exc1)
        self._rate.append((time.monotonic(), len(group)))
        _ = t0
        for p, r in zip(group, results, strict=True):
            p.result = r
            if p.loop is not None and p.future is not None:
                if _on_loop(p.loop):
                    _resolve(p.future, r)
                else:
                    p.loop.call_soon_threadsafe(_resolve, p.future, r)
            elif p.done is not None:
                p.done.set()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _resolve(fut: asyncio.Future[Ack], r: Ack | BaseException) -> None:
    if fut.done():
        return
    if isinstance(r, BaseException):
        fut.set_exception(r)
    else:
        fut.set_result(r)
