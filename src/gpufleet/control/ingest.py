"""Ingest: decode a pushed batch (gzip, size limits, schema), then commit it through the
control plane's one writer thread (`gpufleet.control.writer`), which groups concurrent batches
into one transaction (group commit).

A request's future resolves only after its group's transaction has committed, so an ``Ack``
always means durable. When the queue holds more than ``max_pending`` batches the endpoint
answers 429 with ``Retry-After`` instead of queueing more.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from pydantic import ValidationError

from gpufleet.agent.wire import MAX_BATCH_BYTES, Ack, Batch, WireSamples
from gpufleet.control.store import ControlStore, IngestItem
from gpufleet.control.telemetry_store import FIELDS, NF, SampleGroup, clean_matrix

log = logging.getLogger("gpufleet.control.ingest")
MAX_GPUS_PER_NODE = 1024


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


SAMPLE_KEYS = frozenset({"gpu_uuid", "gpu_index", "t", "fields"})
_TIMES = frozenset({float, int})
_LIST = {list}
FIELD_SET = frozenset(FIELDS)


@dataclass(frozen=True)
class Parsed:
    """A validated batch and its samples as arrays (groups of GPUs with equal sample counts)."""

    batch: Batch
    arrays: list[SampleGroup]


def _column_ok(col: Any, k: int) -> bool:
    """One column: k values, each a number or null (or what pydantic's lax mode takes for a
    float: numeric strings, booleans)."""
    if type(col) is not list or len(col) != k:
        return False
    try:
        return np.array(col, dtype=np.float64).shape == (k,)
    except (TypeError, ValueError, OverflowError):
        return False


def _first_bad_column(items: list[Any]) -> IngestRejected:
    """The 422 naming the first column that is not k numbers or nulls (the slow path, only
    taken once the fast conversion of a whole batch has failed)."""
    for i, it in enumerate(items):
        k = len(it["t"])
        for name, col in it["fields"].items():
            if not _column_ok(col, k):
                what = (
                    f"must be a list of {k} values (one per t)"
                    if type(col) is not list or len(col) != k
                    else "numbers or null expected"
                )
                return IngestRejected(422, f"samples.{i}.fields.{name}: {what}")
    return IngestRejected(422, "samples: numbers or null expected")


def _as_floats(values: list[Any], items: list[Any]) -> npt.NDArray[np.float64]:
    """``values`` as one flat float64 array, or the 422 naming the first bad column."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise _first_bad_column(items) from None
    if arr.shape != (len(values),):  # a column held lists of equal length
        raise _first_bad_column(items)
    return arr


@dataclass
class _Group:
    gpus: list[int] = field(default_factory=list)
    ts: list[Any] = field(default_factory=list)
    flat: list[Any] = field(default_factory=list)  # kept metrics, FIELDS order, block by block


def _samples(items: Any) -> tuple[list[WireSamples], list[SampleGroup]]:
    """Validate columnar samples without pydantic (the same rules as `WireSamples`, several
    times faster): shape checks per block, then one numpy conversion per batch validates every
    value and builds the arrays for the telemetry store."""
    if type(items) is not list:
        raise IngestRejected(422, "samples: must be a list")
    out: list[WireSamples] = []
    groups: dict[int, list[_Group]] = {}  # by sample count; a GPU seen twice starts a group
    extra: list[Any] = []  # values of metrics not kept: validated, then dropped
    for i, it in enumerate(items):
        where = f"samples.{i}"
        if type(it) is not dict:
            raise IngestRejected(422, f"{where}: must be an object")
        if it.keys() != SAMPLE_KEYS:
            keys = set(it)
            if keys - SAMPLE_KEYS:
                raise IngestRejected(422, f"{where}.{sorted(keys - SAMPLE_KEYS)[0]}: not allowed")
            raise IngestRejected(422, f"{where}.{sorted(SAMPLE_KEYS - keys)[0]}: field required")
        uuid, idx, t, fields = it["gpu_uuid"], it["gpu_index"], it["t"], it["fields"]
        if type(uuid) is not str:
            raise IngestRejected(422, f"{where}.gpu_uuid: must be a string")
        if type(idx) is not int:
            raise IngestRejected(422, f"{where}.gpu_index: must be an integer")
        if not 0 <= idx < MAX_GPUS_PER_NODE:
            raise IngestRejected(422, f"{where}.gpu_index: must be in [0, {MAX_GPUS_PER_NODE})")
        if type(t) is not list or type(fields) is not dict:
            raise IngestRejected(422, f"{where}: t must be a list and fields an object")
        if not _TIMES.issuperset(map(type, t)):
            raise IngestRejected(422, f"{where}.t: a flat list of finite numbers expected")
        k = len(t)
        cols = fields.values()
        if cols and (set(map(type, cols)) != _LIST or set(map(len, cols)) != {k}):
            raise _first_bad_column(items[: i + 1])
        out.append(WireSamples.model_construct(gpu_uuid=uuid, gpu_index=idx, t=t, fields=fields))
        if k == 0:
            continue
        for name in fields.keys() - FIELD_SET:
            extra.extend(fields[name])
        runs = groups.setdefault(k, [])
        if not runs or idx in runs[-1].gpus:
            runs.append(_Group())
        grp = runs[-1]
        grp.gpus.append(idx)
        grp.ts.append(t)
        none_row = [None] * k
        get = fields.get
        grp.flat.extend(chain.from_iterable([get(name) or none_row for name in FIELDS]))
    if extra:
        _as_floats(extra, items)
    arrays = []
    for k, runs in groups.items():
        for grp in runs:
            mat = _as_floats(grp.flat, items).reshape(len(grp.gpus), NF, k)
            tarr = np.array(grp.ts, dtype=np.float64)
            if not bool(np.isfinite(tarr).all()):
                raise IngestRejected(422, "samples: t must hold finite numbers")
            arrays.append(SampleGroup(grp.gpus, tarr, clean_matrix(mat)))
    return out, arrays


def parse_batch(raw: bytes) -> Parsed:
    """Validate against the wire schema; 422 with the first problem's location and message.

    JSON is decoded with orjson; samples (the bulk of a batch) are checked without pydantic
    (see `_samples`), the rest of the batch (small) with the wire schema's pydantic model."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise IngestRejected(422, f"body is not JSON: {exc}") from exc
    if type(obj) is not dict:
        raise IngestRejected(422, "body: a JSON object expected")
    samples, arrays = _samples(obj.pop("samples", []))
    try:
        batch = Batch.model_validate(obj)
    except ValidationError as exc:
        errs = exc.errors(include_url=False)
        first = errs[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise IngestRejected(422, f"{where}: {first['msg']}{more}") from exc
    object.__setattr__(batch, "samples", samples)  # validated above; frozen model, no copy
    if b"\\u0000" in raw:
        raise IngestRejected(422, "strings must not contain NUL characters")
    if batch.seq >= 2**63:
        raise IngestRejected(422, "seq: must be below 2**63")
    if not math.isfinite(batch.sent_at_s):
        raise IngestRejected(422, "sent_at_s: must be a finite number")
    if not (0.0 < batch.heartbeat_interval_s <= 3600.0):
        raise IngestRejected(422, "heartbeat_interval_s: must be in (0, 3600]")
    for where, idx in (
        *((f"devices.{i}.index", d.index) for i, d in enumerate(batch.devices or [])),
        *((f"findings.{i}.gpu_index", f.gpu_index or 0) for i, f in enumerate(batch.findings)),
        *((f"events.{i}.gpu_index", e.gpu_index) for i, e in enumerate(batch.events)),
    ):
        if not 0 <= idx < MAX_GPUS_PER_NODE:
            raise IngestRejected(422, f"{where}: must be in [0, {MAX_GPUS_PER_NODE})")
    for i, e in enumerate(batch.events):
        if not math.isfinite(e.timestamp_s):
            raise IngestRejected(422, f"events.{i}.timestamp_s: must be a finite number")
    for i, f in enumerate(batch.findings):
        if not (math.isfinite(f.first_seen_s) and math.isfinite(f.last_seen_s)):
            raise IngestRejected(422, f"findings.{i}: first_seen_s/last_seen_s must be finite")
    return Parsed(batch, arrays)


class IngestQueue:
    """Ingest's side of the writer (`gpufleet.control.writer`): admission (429 with
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
