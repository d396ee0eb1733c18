"""Screening of samples, the ingest path against the wire model: a Hypothesis differential test.

`gpufleet.wire.screen_samples` (plain Python over the model) is the reference for which samples
and readings a control plane keeps; the ingest path screens its numpy arrays instead
(`control.ingest.screen`, reached through ``parse_batch(raw, now_s)``). For batches whose times
and readings are drawn around the window's edges and the fields' ranges (inside, outside, on the
bound, NaN-free JSON numbers of any size), both keep the same readings at the same times of the
same GPUs and count the same drops by field; a batch is "unusable" exactly when something was
dropped and nothing is left.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.control.ingest.queue import parse_batch, sample_arrays
from gpufleet.control.state.rings import FIELDS, SampleGroup
from gpufleet.wire import Batch
from gpufleet.wire.limits import SAMPLE_AHEAD_S, SAMPLE_BEHIND_S, SAMPLE_RANGES
from gpufleet.wire.telemetry import screen_samples
from tests.hypothesis_budget import examples

pytestmark = pytest.mark.process


NOW = 1_800_000_000.0
EDGES = [NOW - SAMPLE_BEHIND_S, NOW + SAMPLE_AHEAD_S]


def _near(x: float) -> st.SearchStrategy[float]:
    """``x`` itself or the nearest floats on either side."""
    return st.sampled_from([x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf)])


times = st.one_of(
    st.floats(NOW - 3600, NOW),  # recent
    st.floats(EDGES[0] - 1e6, EDGES[1] + 1e6),  # around the window
    *(_near(e) for e in EDGES),
    st.sampled_from([-1e30, 0.0, 1e15, 1e308, -1e308]),
)


@st.composite
def reading(draw: st.DrawFn, name: str) -> float | int | None:
    lo, hi = SAMPLE_RANGES.get(name, (-1e6, 1e6))
    value: float | int | None = draw(
        st.one_of(
            st.none(),
            st.floats(lo, hi),
            _near(lo),
            _near(hi),
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(-(2**70), 2**70),
        )
    )
    return value


@st.composite
def blocks(draw: st.DrawFn) -> dict[str, Any]:
    k = draw(st.integers(0, 5))
    names = draw(st.sets(st.sampled_from([*FIELDS, "fan_speed_pct"]), max_size=5))
    return {
        "gpu_uuid": "GPU-x",
        "gpu_index": draw(st.integers(0, 7)),
        "t": draw(st.lists(times, min_size=k, max_size=k)),
        "fields": {n: [draw(reading(n)) for _ in range(k)] for n in sorted(names)},
    }


def rows(groups: list[SampleGroup]) -> list[tuple[int, str, tuple[str, ...]]]:
    """Every stored sample as (gpu, time, readings) with NaN spelt out, sorted."""
    out = []
    for g in groups:
        for b, gpu in enumerate(g.gpus):
            for i in range(g.t.shape[1]):
                vals = tuple("-" if np.isnan(v) else float(v).hex() for v in g.mat[b, :, i])
                out.append((gpu, float(g.t[b, i]).hex(), vals))
    return sorted(out)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(blocks(), max_size=4))
def test_ingest_screens_like_the_model(samples: list[dict[str, Any]]) -> None:
    body = {"node": "n1", "agent_id": "a", "seq": 1, "sent_at_s": NOW, "samples": samples}
    batch = Batch.model_validate(body)
    kept, dropped = screen_samples(batch.samples, NOW)
    got = parse_batch(json.dumps(body).encode(), NOW)
    assert got.dropped == dropped
    assert rows(got.arrays) == rows(sample_arrays(kept))
    left = any(v is not None for s in kept for n in FIELDS for v in s.fields.get(n, ()))
    assert got.unusable == (bool(dropped) and not left)
