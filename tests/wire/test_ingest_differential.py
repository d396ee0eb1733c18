"""The ingest parser against the `Batch` model: a Hypothesis differential test.

Batches are generated clean (valid by construction) or with a defect or two in one place (wrong
types, out-of-range and non-finite numbers, integers past float64, too-long arrays, columns of the
wrong length, missing and extra keys, bad field names, unicode and NUL in strings, bad top-level
fields). For each, the ingest parser (`control.ingest.queue.parse_batch`, given the batch as JSON
bytes) accepts exactly what ``Batch.model_validate`` accepts on the Python object, reads the same
values and hands the telemetry store every time and every real reading; a refusal names the model's
first problem by its field path. (A NUL anywhere is refused on top of the model.) The accept-only
fast path in front of the model (`control.ingest.parse`) is checked on its own too: it accepts only
what the model's JSON validation accepts, with the same values, and takes every clean batch.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.control.ingest.parse import parse_fast
from gpufleet.control.ingest.queue import IngestRejected, parse_batch
from gpufleet.control.state.rings import FIELDS
from gpufleet.wire import Batch, WireSamples
from gpufleet.wire.limits import (
    MAX_FIELDS_PER_BLOCK,
    MAX_GPUS_PER_NODE,
    MAX_SAMPLE_BLOCKS,
    MAX_SAMPLES_PER_BLOCK,
)
from gpufleet.wire.problems import first_problem
from tests.hypothesis_budget import examples

KNOWN = ("gpu_util_pct", "power_w", "sm_clock_mhz", "ecc_dbe_volatile", "fan_speed_pct")
BIG_INTS = (2**1023, 2**1024, -(10**400), 10**308, 2**64, -(2**63))

# ----- clean values ---------------------------------------------------------------------------
good_time = st.one_of(st.floats(0, 2e9), st.integers(0, 2**40))
good_value = st.one_of(st.none(), st.floats(-1e12, 1e12), st.integers(-(2**53), 2**53))
good_name = st.one_of(
    st.sampled_from(KNOWN), st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
)
good_uuid = st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s)
good_index = st.integers(0, MAX_GPUS_PER_NODE - 1)
good_node = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)

# ----- dirty values: a slot's clean values, or values that are wrong (or just barely right) ---
NASTY: list[Any] = [
    None,
    True,
    False,
    "1.5",
    "nan",
    "",
    [1.0],
    {},
    math.nan,
    math.inf,
    -math.inf,
    1.5,
]
odd = st.one_of(
    st.sampled_from([*NASTY, *BIG_INTS]),
    st.sampled_from([*NASTY, *BIG_INTS]),
    st.sampled_from([*NASTY, *BIG_INTS]),
    st.text(max_size=4),
    st.floats(),
    st.integers(-(2**70), 2**70),
)
any_time = st.one_of(good_time, odd, odd)
any_value = st.one_of(good_value, odd, odd)
any_name = st.one_of(
    good_name, st.text(max_size=8), st.sampled_from(["Power", "a" * 64, "a" * 65, "x\n", "é"])
)
any_uuid = st.one_of(
    good_uuid, st.text(max_size=4), st.sampled_from(["u" * 96, "u" * 97, "a\x00b", "é"]), odd
)
any_index = st.one_of(
    good_index, st.sampled_from([-1, MAX_GPUS_PER_NODE - 1, MAX_GPUS_PER_NODE]), odd
)

STRUCTURAL = (
    "drop_key",
    "extra_key",
    "t_not_list",
    "fields_not_dict",
    "block_not_dict",
    "long_t",
    "many_fields",
    "short_column",
)

SLOTS = ("uuid", "index", "time", "value", "value", "name")


@st.composite
def clean_block(draw: st.DrawFn) -> dict[str, Any]:
    k = draw(st.integers(0, 4))
    return {
        "gpu_uuid": draw(good_uuid),
        "gpu_index": draw(good_index),
        "t": draw(st.lists(good_time, min_size=k, max_size=k)),
        "fields": draw(
            st.dictionaries(good_name, st.lists(good_value, min_size=k, max_size=k), max_size=4)
        ),
    }


def _intact(block: Any) -> bool:
    """Still of the shape `spoil_block` works on (not yet spoilt in its structure)."""
    return (
        isinstance(block, dict)
        and isinstance(block.get("t"), list)
        and isinstance(block.get("fields"), dict)
    )


def spoil_block(draw: st.DrawFn, block: dict[str, Any]) -> Any:
    """``block`` with one defect (or, now and then, a borderline value that is still fine)."""
    k = len(block["t"])
    what = draw(st.sampled_from((*STRUCTURAL, *SLOTS, *SLOTS)))
    if what == "uuid":
        block["gpu_uuid"] = draw(any_uuid)
    elif what == "index":
        block["gpu_index"] = draw(any_index)
    elif what == "time":
        block["t"] = [*block["t"], draw(any_time)]
        block["fields"] = {n: [*c, None] for n, c in block["fields"].items()}
    elif what == "value" and k:
        col = [draw(good_value) for _ in range(k)]
        col[draw(st.integers(0, k - 1))] = draw(any_value)
        block["fields"][draw(good_name)] = col
    elif what == "name":
        block["fields"][draw(any_name)] = [None] * k
    elif what == "drop_key":
        del block[draw(st.sampled_from(sorted(block)))]
    elif what == "extra_key":
        block[draw(st.sampled_from(["x", "gpu", "T"]))] = 1
    elif what == "t_not_list":
        block["t"] = draw(st.one_of(st.none(), st.just(1.0), st.just({"0": 1.0})))
    elif what == "fields_not_dict":
        block["fields"] = draw(st.one_of(st.none(), st.just([]), st.just("power_w")))
    elif what == "block_not_dict":
        return draw(st.one_of(st.none(), st.just([]), st.just("block")))
    elif what == "long_t":  # one past the limit (or exactly at it), columns to match
        n = MAX_SAMPLES_PER_BLOCK + draw(st.integers(0, 1))
        block["t"] = [float(i) for i in range(n)]
        block["fields"] = {"power_w": [1.0] * n}
    elif what == "many_fields":
        n = MAX_FIELDS_PER_BLOCK + draw(st.integers(0, 1))
        block["fields"] = {f"f{i}": [None] * k for i in range(n)}
    elif what == "short_column":
        block["fields"]["power_w"] = [1.0] * (k + draw(st.sampled_from([-1, 1])) if k else 1)
    return block


REST_EDITS: dict[str, Any] = {
    "seq": [0, 2**63, "1", 1.5, True],
    "sent_at_s": [math.nan, math.inf, "now", None],
    "heartbeat_interval_s": [0, -1.0, 3600.5, 1e-9, 0.099],
    "node": ["", "a\x00b", "n" * 254, 7, "a/b", "a b", "gpu[001-128]", "x\n", "-n", "n" * 253],
    "agent_id": [None, ""],
    "schema_version": [2],
    "health": [4, -1],
    "extra": [1],
    "devices": [[{"index": MAX_GPUS_PER_NODE, "uuid": "u", "info": {}}], "all"],
    "events": [[{"gpu_index": 0, "kind": "xid", "timestamp_s": math.inf}]],
    "findings": [
        [
            {
                "rule": "r",
                "code": "C",
                "severity": 2,
                "component": "c",
                "message": "m",
                "gpu_index": -1,
            }
        ]
    ],
}


@st.composite
def batches(draw: st.DrawFn) -> Any:
    """A clean batch, or one with a defect or two in one place (a batch full of problems would
    be refused by any parser and prove nothing)."""
    body: dict[str, Any] = {
        "node": draw(st.one_of(good_node, good_node, st.text(min_size=1, max_size=20))),
        "agent_id": "agent-1",
        "seq": draw(st.integers(1, 2**63 - 1)),
        "sent_at_s": 1.7e9,
        "samples": draw(st.lists(clean_block(), max_size=4)),
    }
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2]))):
        where = draw(st.integers(0, 9))
        if where <= 5 and body.get("samples"):  # inside one block
            i = draw(st.integers(0, len(body["samples"]) - 1))
            if _intact(body["samples"][i]):
                body["samples"][i] = spoil_block(draw, body["samples"][i])
        elif where == 6:  # a bad top-level field
            key = draw(st.sampled_from(sorted(REST_EDITS)))
            body[key] = draw(st.sampled_from(REST_EDITS[key]))
        elif where == 7:
            body["samples"] = draw(st.one_of(st.none(), st.just({}), st.just("samples")))
        elif where == 8:
            body.pop("samples", None)
        else:  # blocks past the limit (or exactly at it)
            empty = {"gpu_uuid": "u", "gpu_index": 0, "t": [], "fields": {}}
            body["samples"] = [empty] * (MAX_SAMPLE_BLOCKS + draw(st.integers(0, 1)))
    return body


def readings(samples: list[WireSamples]) -> list[Any]:
    """Samples as float64 values (NaN comparable; an integer reading as the float it becomes)."""

    def f(v: float | None) -> str | None:
        return None if v is None else float(v).hex()

    return [
        (
            s.gpu_uuid,
            s.gpu_index,
            [f(v) for v in s.t],
            {n: [f(v) for v in c] for n, c in s.fields.items()},
        )
        for s in samples
    ]


def stored_values(samples: list[WireSamples]) -> tuple[list[float], int]:
    """What the telemetry store should get from ``samples``: every time, and how many readings
    of its metrics are real numbers (not null, not beyond float32)."""
    times = [float(v) for s in samples for v in s.t]
    kept = sum(
        1
        for s in samples
        for name in FIELDS
        for v in s.fields.get(name) or ()
        if v is not None and abs(float(v)) <= 3.0e38
    )
    return times, kept


def check(obj: Any) -> None:
    """The ingest parser, given ``obj`` as JSON, answers as ``Batch.model_validate`` does."""
    raw = json.dumps(obj).encode()  # NaN and the infinities as JSON's common extension
    try:
        want: Batch | tuple[str, str] = Batch.model_validate(obj)
    except ValidationError as exc:
        want = first_problem(exc)
    try:
        got = parse_batch(raw)
    except IngestRejected as exc:
        assert exc.status == 422
        if isinstance(want, Batch):  # accepted by the model: only a NUL may be refused
            assert b"\\u0000" in raw and "NUL" in exc.reason, exc.reason
        else:  # the same field path (pydantic words a few JSON-mode messages differently)
            assert exc.reason.startswith(f"{want[0]}: "), (exc.reason, want)
        return
    assert isinstance(want, Batch), f"accepted what the model refuses: {want}"
    assert b"\\u0000" not in raw
    b = got.batch
    assert b.model_dump(exclude={"samples"}) == want.model_dump(exclude={"samples"})
    assert readings(b.samples) == readings(want.samples)
    times, kept = stored_values(want.samples)
    assert sorted(float(v) for g in got.arrays for v in g.t.ravel()) == sorted(times)
    assert sum(int(np.isfinite(g.mat).sum()) for g in got.arrays) == kept


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean_block(), st.data())
def test_one_block_answers_like_the_model(block: dict[str, Any], data: Any) -> None:
    """One block with one defect (or none)."""
    if data.draw(st.integers(0, 4)):
        block = spoil_block(data.draw, block)
    check({"node": "n", "agent_id": "a", "seq": 1, "sent_at_s": 1.0, "samples": [block]})


BOUNDARY = [0, -1, 1.5, 1e308, -1e308, 2**53 + 1, MAX_GPUS_PER_NODE - 1, MAX_GPUS_PER_NODE]


def _put(block: dict[str, Any], slot: str, v: Any) -> None:
    if slot in ("gpu_uuid", "gpu_index"):
        block[slot] = v
    elif slot == "t":
        block["t"][1] = v
    elif slot == "value":
        block["fields"]["power_w"][0] = v
    else:  # a field name
        block["fields"][v] = [None, None]


@pytest.mark.parametrize("slot", ["gpu_uuid", "gpu_index", "t", "value", "name"])
def test_every_odd_value_in_every_slot(slot: str) -> None:
    """Each odd or borderline value, alone in one place of a good block (the deterministic
    complement of the random tests)."""
    texts = ["", "u" * 96, "u" * 97, "a\x00b", "é", "Power", "a" * 64, "a" * 65, "x\n", "_x", "x1"]
    for v in [*NASTY, *BIG_INTS, *BOUNDARY, *texts]:
        if slot == "name" and not isinstance(v, str):
            continue
        block = {"gpu_uuid": "u", "gpu_index": 0, "t": [1.0, 2.0], "fields": {"power_w": [1, 2]}}
        _put(block, slot, v)
        check({"node": "n", "agent_id": "a", "seq": 1, "sent_at_s": 1.0, "samples": [block]})


@settings(
    max_examples=examples(250),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batches())
def test_batches_answer_like_the_model(obj: dict[str, Any]) -> None:
    """Whole batches: clean, or with a defect or two anywhere (samples or top-level fields)."""
    check(obj)


def fast_agrees(obj: Any, raw: bytes | None = None) -> Batch | None:
    """The fast path's answer on ``obj`` (as JSON), checked against the model's JSON validation:
    it accepts only what the model accepts, with the same values and the same fields set."""
    raw = json.dumps(obj).encode() if raw is None else raw
    got = parse_fast(raw)
    if got is None:
        return None
    want = Batch.model_validate_json(raw)  # raises if the fast path accepted too much
    assert got == want
    assert got.model_fields_set == want.model_fields_set
    assert [s.model_fields_set for s in got.samples] == [s.model_fields_set for s in want.samples]
    assert readings(got.samples) == readings(want.samples)
    assert all(type(v) is float for s in got.samples for v in s.t)  # as the model reads them
    return got


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_fast_path_accepts_only_what_the_model_accepts(obj: dict[str, Any]) -> None:
    """The accept-only fast path never accepts a batch the model refuses, nor reads one
    differently (a refusal always comes from the model: `parse_batch` falls back to it)."""
    fast_agrees(obj)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(clean_block(), max_size=4), st.integers(1, 2**63 - 1))
def test_clean_batches_take_the_fast_path(blocks: list[dict[str, Any]], seq: int) -> None:
    """A clean batch is accepted by the fast path itself, not only by the model after it."""
    obj = {"node": "n", "agent_id": "a", "seq": seq, "sent_at_s": 1.7e9, "samples": blocks}
    assert fast_agrees(obj) is not None


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("xid", 2**64 + 1),  # orjson reads it as a float: the model decides
        ("name", "power_w\n"),  # Python's $ would let the newline through
        ("t", True),
        ("value", "1.5"),
        ("uuid", "u" * 97),
        ("seq", 2**63),
    ],
)
def test_fast_path_leaves_doubtful_bodies_to_the_model(where: str, value: Any) -> None:
    """Bodies where orjson and a plain check could disagree with the model go to the model."""
    block: dict[str, Any] = {"gpu_uuid": "u", "gpu_index": 0, "t": [1.0], "fields": {}}
    obj: dict[str, Any] = {"node": "n", "agent_id": "a", "seq": 1, "sent_at_s": 1.0}
    if where == "xid":
        obj["events"] = [{"gpu_index": 0, "kind": "xid", "timestamp_s": 1.0, "xid": value}]
    elif where == "name":
        block["fields"][value] = [1.0]
    elif where == "t":
        block["t"] = [value]
    elif where == "value":
        block["fields"]["power_w"] = [value]
    elif where == "uuid":
        block["gpu_uuid"] = value
    else:
        obj[where] = value
    obj["samples"] = [block]
    assert parse_fast(json.dumps(obj).encode()) is None
    check(obj)  # and parse_batch still answers like the model


def test_integers_are_read_as_floats_like_the_model() -> None:
    obj = {"node": "n", "agent_id": "a", "seq": 1, "sent_at_s": 1}
    obj["samples"] = [{"gpu_uuid": "u", "gpu_index": 3, "t": [1, 2], "fields": {"x": [None, 7]}}]
    got = fast_agrees(obj)
    assert got is not None and got.samples[0].t == [1.0, 2.0]
    assert got.samples[0].fields == {"x": [None, 7.0]}
