"""Samples and events a control plane keeps, on the ingest path's arrays: a sample whose time
is outside the window around the controller's clock is dropped, a reading outside its field's
range is dropped, each counted by field (`gpufleet.wire.limits`: ``SAMPLE_AHEAD_S``,
``SAMPLE_BEHIND_S``, ``SAMPLE_RANGES``). The same rules as `gpufleet.wire.screen_samples`,
vectorised; a clean batch costs two comparisons per group of GPUs.
"""

from __future__ import annotations

import numpy as np

from gpufleet.control.state.rings import FIELDS, SampleGroup
from gpufleet.wire.limits import SAMPLE_AHEAD_S, SAMPLE_BEHIND_S, SAMPLE_RANGES, TIME_FIELD

_LO = np.array([SAMPLE_RANGES[f][0] for f in FIELDS])[None, :, None]
_HI = np.array([SAMPLE_RANGES[f][1] for f in FIELDS])[None, :, None]


def screen_groups(
    groups: list[SampleGroup], now_s: float
) -> tuple[list[SampleGroup], dict[str, int]]:
    """``groups`` (matrices not yet cleaned: `ingest.sample_arrays` with ``clean=False``) as
    the store may take them, and the counts of what was dropped by field."""
    lo_t, hi_t = now_s - SAMPLE_BEHIND_S, now_s + SAMPLE_AHEAD_S
    dropped: dict[str, int] = {}
    out: list[SampleGroup] = []
    for g in groups:
        t, mat = g.t, g.mat
        in_time = (t >= lo_t) & (t <= hi_t)  # (B, k)
        # a reading is bad when present (not NaN) and out of range; NaN compares False
        bad = ~((mat >= _LO) & (mat <= _HI)) & ~np.isnan(mat) & in_time[:, None, :]
        if bool(bad.any()):
            per_field = bad.sum(axis=(0, 2))
            for j in np.flatnonzero(per_field).tolist():
                dropped[FIELDS[j]] = dropped.get(FIELDS[j], 0) + int(per_field[j])
            mat = np.where(bad, np.nan, mat)
        late = int(in_time.size - np.count_nonzero(in_time))
        if not late:
            out.append(SampleGroup(g.gpus, t, mat))
            continue
        dropped[TIME_FIELD] = dropped.get(TIME_FIELD, 0) + late
        for row, gpu in enumerate(g.gpus):  # rare: each GPU keeps its own number of samples
            keep = in_time[row]
            if bool(keep.any()):
                out.append(
                    SampleGroup([gpu], t[row : row + 1, keep], mat[row : row + 1][:, :, keep])
                )
    return out, dropped


def has_readings(groups: list[SampleGroup]) -> bool:
    """Whether any group holds at least one reading of a kept metric."""
    return any(bool(np.isfinite(g.mat).any()) for g in groups)
