"""Ingest: decode a pushed batch (gzip, size limits, the `gpufleet.wire.Batch` model), then
commit it through the control plane's one writer thread (`gpufleet.control.state.writer`), which
groups concurrent batches into one transaction (group commit).

A request's future resolves only after its group's transaction has committed, so an ``Ack``
always means durable. When the queue holds more than ``max_pending`` batches the endpoint
answers 429 with ``Retry-After`` instead of queueing more.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from gpufleet.control.ingest.parse import Block, parse_fast_parts, wire_samples
from gpufleet.control.ingest.screen import has_readings, screen_groups
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.rings import FIELD_INDEX, FIELDS, NF, SampleGroup, clean_matrix
from gpufleet.control.state.store import ControlStore, IngestItem
from gpufleet.wire import MAX_BATCH_BYTES, Ack, Batch, WireSamples
from gpufleet.wire.problems import problem_extra, reason
from gpufleet.wire.telemetry import screen_events

log = logging.getLogger("gpufleet.control.ingest")


class IngestRejected(Exception):
    """A batch refused before it was queued: ``status`` is the HTTP status, ``reason`` why,
    ``extra`` more members of the problem body (`gpufleet.wire.problems.problem_extra`)."""

    def __init__(
        self,
        status: int,
        reason: str,
        retry_after_s: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.extra = extra or {}


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
    """A validated batch and its samples as arrays (groups of GPUs with equal sample counts);
    screened (`sample_screen`): ``dropped`` counts what was left out by field, ``unusable``
    says that something was and nothing is left to store but the heartbeat.

    ``head`` is the batch without its sample blocks (``blocks``: as sent, checked), which the
    ingest path needs only as arrays; ``batch`` builds the whole `Batch` when asked."""

    head: Batch
    blocks: list[Block]
    arrays: list[SampleGroup]
    dropped: dict[str, int] = field(default_factory=dict)
    unusable: bool = False

    @cached_property
    def batch(self) -> Batch:
        if not self.blocks:
            return self.head
        return self.head.model_copy(update={"samples": [wire_samples(b) for b in self.blocks]})


@dataclass
class _Group:
    rows: npt.NDArray[np.intp]  # where the block's kept metrics go among FIELDS
    gpus: list[int] = field(default_factory=list)
    ts: list[Any] = field(default_factory=list)
    flat: list[Any] = field(default_factory=list)  # kept metrics present, block by block


class _KeptLayout:
    """Which of a block's fields the telemetry store keeps, per tuple of field names (agents
    send the same few tuples over and over): a getter for their columns and their rows."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, ...], tuple[Callable[[Any], Any] | None, Any]] = {}

    def of(self, names: tuple[str, ...]) -> tuple[Callable[[Any], Any] | None, Any]:
        got = self._known.get(names)
        if got is None:
            kept = [n for n in FIELDS if n in names]
            rows = np.array([FIELD_INDEX[n] for n in kept], dtype=np.intp)
            pick = itemgetter(*kept) if len(kept) > 1 else _one(kept[0]) if kept else None
            if len(self._known) >= 4096:
                self._known.clear()
            got = self._known[names] = (pick, rows)
        return got


def _one(name: str) -> Callable[[Any], Any]:
    return lambda fields: (fields[name],)


_kept = _KeptLayout()


def sample_arrays(samples: list[WireSamples], *, clean: bool = True) -> list[SampleGroup]:
    """Validated samples as arrays for the telemetry store (see `block_arrays`)."""
    return block_arrays([(s.gpu_uuid, s.gpu_index, s.t, s.fields) for s in samples], clean=clean)


def block_arrays(blocks: list[Block], *, clean: bool = True) -> list[SampleGroup]:
    """Checked sample blocks as arrays for the telemetry store: one numpy conversion per group
    of GPUs with the same sample count and field names (a GPU seen twice starts a new group);
    metrics the store does not keep are dropped, a JSON integer becomes the float it is, as in
    the model. ``clean=False`` leaves readings as sent (for screening)."""
    groups: dict[tuple[int, tuple[str, ...]], list[_Group]] = {}
    for _, gpu, t, fields in blocks:
        k = len(t)
        if k == 0:
            continue
        names = tuple(fields)
        pick, rows = _kept.of(names)
        runs = groups.setdefault((k, names), [])
        if not runs or gpu in runs[-1].gpus:
            runs.append(_Group(rows))
        grp = runs[-1]
        grp.gpus.append(gpu)
        grp.ts.append(t)
        if pick is not None:
            grp.flat.extend(chain.from_iterable(pick(fields)))
    arrays = []
    for (k, _), runs in groups.items():
        for grp in runs:
            mat = np.full((len(grp.gpus), NF, k), np.nan)
            if len(grp.rows):
                vals = np.array(grp.flat, dtype=np.float64)
                kept = clean_matrix(vals) if clean else vals
                mat[:, grp.rows, :] = kept.reshape(len(grp.gpus), len(grp.rows), k)
            tarr = np.array(grp.ts, dtype=np.float64)
            arrays.append(SampleGroup(grp.gpus, tarr, mat))
    return arrays


def parse_batch(raw: bytes, now_s: float | None = None) -> Parsed:
    """Validate against the wire contract: the accept-only fast path
    (`gpufleet.control.ingest.parse`), else `Batch` itself (pydantic's JSON validation), which
    accepts or refuses with 422 naming the first problem's field path and message. With
    ``now_s`` (the controller's clock), samples and events outside their window or range are
    dropped and counted."""
    parts = parse_fast_parts(raw)
    whole: Batch | None = None
    if parts is None:
        try:
            whole = Batch.model_validate_json(raw)
        except ValidationError as exc:
            raise IngestRejected(422, reason(exc), extra=problem_extra(exc)) from exc
        head = whole.model_copy(update={"samples": []})
        blocks: list[Block] = [(s.gpu_uuid, s.gpu_index, s.t, s.fields) for s in whole.samples]
    else:
        head, blocks, _ = parts
    if b"\\u0000" in raw:  # also inside free-form mappings (evidence, device info)
        raise IngestRejected(422, "strings must not contain NUL characters")
    if now_s is None:
        return _parsed(head, blocks, block_arrays(blocks), whole)
    arrays, dropped = screen_groups(block_arrays(blocks, clean=False), now_s)
    if head.events:
        events = screen_events(head.events, now_s, dropped)
        if len(events) < len(head.events):
            head = head.model_copy(update={"events": events})
            whole = None
    unusable = bool(dropped) and not (
        has_readings(arrays) or head.findings or head.events or head.devices or head.jobs
    )
    return _parsed(head, blocks, arrays, whole, dropped, unusable)


def _parsed(
    head: Batch,
    blocks: list[Block],
    arrays: list[SampleGroup],
    whole: Batch | None,
    dropped: dict[str, int] | None = None,
    unusable: bool = False,
) -> Parsed:
    p = Parsed(head, blocks, arrays, dropped or {}, unusable)
    if whole is not None:  # the model's own batch (the slow path): no need to build it again
        p.__dict__["batch"] = whole
    return p


def queue_item(parsed: Parsed, principal: Principal, received_s: float) -> IngestItem:
    """The unit of work for the writer, holding the samples as arrays only: the batch's own
    sample blocks (a few hundred small lists and dicts) are left out, so they are freed as soon
    as the request has parsed them instead of living on, with every batch in flight, until the
    group commit (where the garbage collector would have to walk them again and again)."""
    gpus: dict[int, str] = {}
    count = 0
    energy = []
    for uuid, gpu, t, fields in parsed.blocks:
        gpus.setdefault(gpu, uuid)
        count += len(t)
        mj = fields.get("energy_mj")
        if mj is not None:  # slow-tier blocks only: the energy ledger's counter readings
            energy.append((gpu, t, mj))
    return IngestItem(
        parsed.head,
        principal,
        received_s,
        parsed.arrays,
        count,
        tuple(gpus.items()),
        tuple(energy),
    )


class IngestQueue:
    """Ingest's side of the writer (`gpufleet.control.state.writer`): admission (429 with
    ``Retry-After`` past ``max_pending`` queued batches), submission, acknowledgement latencies.
    ``start``/``stop`` start and stop the writer thread."""

    def __init__(self, store: ControlStore, *, max_pending: int = 2000) -> None:
        self.store = store
        self.writer = store.writer
        self.max_pending = max_pending
        self.latencies_ms: deque[float] = deque(maxlen=50_000)

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()

    @property
    def pending(self) -> int:
        return self.writer.pending

    def retry_after_s(self) -> int:
        """How long to wait, from the recent commit rate (at least 1 s)."""
        rate = list(self.writer.rate)
        if len(rate) >= 2:
            span = rate[-1][0] - rate[0][0]
            done = sum(n for _, n in rate)
            if span > 0 and done:
                return max(1, math.ceil(self.pending / (done / span)))
        return 1

    def check_capacity(self, node: str) -> None:
        if self.pending >= self.max_pending:
            if node:  # a refused batch still proves the node is alive
                now = self.store.clock()
                self.writer.submit(lambda: self.store.touch(node, now))
            raise IngestRejected(
                429, f"ingest queue full ({self.pending} batches waiting)", self.retry_after_s()
            )

    async def submit(self, item: IngestItem) -> Ack:
        """Queue one batch and wait until its group is committed (durable)."""
        return await self.writer.ingest(item)

    def submit_sync(self, item: IngestItem, timeout_s: float = 60.0) -> Ack:
        """The same from a plain thread (in-process agents, tests)."""
        return self.writer.ingest_sync(item, timeout_s)
