"""The ingest fast path: a decoded JSON batch checked against `Batch` several times faster than
``Batch.model_validate`` for its bulk (the columnar samples), with the same answer.

Samples are checked here with whole-batch set and map operations over the limits in
`gpufleet.wire.limits` (the constants the models state); the rest of a batch (small) is
validated by the model itself. Whatever the fast checks cannot accept goes to the model, which
either accepts it after all or names the first problem, so the reasons are the model's own
(``tests/wire/test_fastparse_differential.py`` holds the two to the same answers).
"""

from __future__ import annotations

import math
import re
from array import array
from functools import partial
from itertools import chain
from operator import is_not
from typing import Any

from pydantic import ValidationError

from gpufleet.wire.batch import Batch
from gpufleet.wire.limits import (
    FIELD_NAME_PATTERN,
    MAX_FIELD_NAME,
    MAX_FIELDS_PER_BLOCK,
    MAX_GPUS_PER_NODE,
    MAX_SAMPLE_BLOCKS,
    MAX_SAMPLES_PER_BLOCK,
    MAX_UUID,
)
from gpufleet.wire.telemetry import WireSamples

SAMPLE_KEYS = frozenset(WireSamples.model_fields)
_TIME_TYPES: frozenset[type] = frozenset({float, int})
_VALUE_TYPES: frozenset[type] = frozenset({float, int, type(None)})
_LIST = {list}
_FIELD_NAME = re.compile(FIELD_NAME_PATTERN)
_not_none = partial(is_not, None)


class BatchRejected(ValueError):
    """A batch the wire contract refuses: ``where`` is the field path (``samples.0.t``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message
        self.reason = f"{where}: {message}"


def rejection(exc: ValidationError) -> BatchRejected:
    """The model's first problem, with its path, and how many more there are."""
    errs = exc.errors(include_url=False)
    first = errs[0]
    loc = list(first["loc"])
    column = first.get("ctx", {}).get("column")
    if column is not None:  # a sample column of the wrong length: name it in the path
        loc.append(column)
    where = ".".join(map(str, loc)) or "body"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return BatchRejected(where, f"{first['msg']}{more}")


class _Names:
    """Field names already seen to match the pattern (a bounded cache: agents send the same)."""

    def __init__(self, limit: int = 4096) -> None:
        self.ok: set[str] = set()
        self.limit = limit

    def all_ok(self, names: Any) -> bool:
        if self.ok.issuperset(names):
            return True
        for name in names:
            if name in self.ok:
                continue
            if len(name) > MAX_FIELD_NAME or _FIELD_NAME.fullmatch(name) is None:
                return False
            if len(self.ok) < self.limit:
                self.ok.add(name)
        return True


_names = _Names()


def fast_samples(items: Any) -> list[WireSamples] | None:
    """The ``samples`` of a decoded batch as models (built without validation), or None when
    the fast checks cannot accept them (then `Batch.model_validate` decides)."""
    if type(items) is not list or len(items) > MAX_SAMPLE_BLOCKS:
        return None
    out: list[WireSamples] = []
    times: list[list[Any]] = []
    columns: list[list[Any]] = []
    construct = WireSamples.model_construct
    for it in items:
        if type(it) is not dict or it.keys() != SAMPLE_KEYS:
            return None
        uuid, idx, t, fields = it["gpu_uuid"], it["gpu_index"], it["t"], it["fields"]
        if type(uuid) is not str or not 0 < len(uuid) <= MAX_UUID or "\x00" in uuid:
            return None
        if type(idx) is not int or not 0 <= idx < MAX_GPUS_PER_NODE:
            return None
        if type(t) is not list or type(fields) is not dict:
            return None
        k = len(t)
        if k > MAX_SAMPLES_PER_BLOCK or len(fields) > MAX_FIELDS_PER_BLOCK:
            return None
        cols = fields.values()
        if cols and (set(map(type, cols)) != _LIST or set(map(len, cols)) != {k}):
            return None
        if not _names.all_ok(fields.keys()):
            return None
        times.append(t)
        columns.extend(cols)
        out.append(construct(gpu_uuid=uuid, gpu_index=idx, t=t, fields=fields))
    if not _numbers_ok(chain.from_iterable(times), _TIME_TYPES, finite=True):
        return None
    if not _numbers_ok(chain.from_iterable(columns), _VALUE_TYPES, finite=False):
        return None
    return out


def _numbers_ok(values: Any, types: frozenset[type], *, finite: bool) -> bool:
    """Every value of one of ``types`` (numbers, and null where allowed), each a float64
    (integers beyond its range are refused, as the model refuses them), finite if asked."""
    values = list(values)
    seen = set(map(type, values))
    if not types.issuperset(seen):
        return False
    try:
        if finite:
            return all(map(math.isfinite, values))
        if int in seen:
            array("d", filter(_not_none, values))  # OverflowError past the float64 range
    except OverflowError:
        return False
    return True


def validate_batch(obj: Any) -> Batch:
    """A decoded JSON batch as a `Batch`, or `BatchRejected` with the model's first problem."""
    samples = fast_samples(obj.get("samples", [])) if type(obj) is dict else None
    if samples is not None:
        rest = {k: v for k, v in obj.items() if k != "samples"}
        try:
            batch = Batch.model_validate(rest)
        except ValidationError:
            pass  # the full model below names the first problem in field order
        else:
            object.__setattr__(batch, "samples", samples)  # checked above; frozen, no copy
            return batch
    try:
        return Batch.model_validate(obj)
    except ValidationError as exc:
        raise rejection(exc) from exc
