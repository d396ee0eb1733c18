"""Energy accounting on the controller (issue 16): per GPU and minute, from the agents' pushes.

Two sources, both additive per minute so partial and late windows merge by addition:

- NVML's total energy counter (``energy_mj``, the agent's slow tier, every ~30 s): the energy
  between two readings (`gpufleet.energy.counter.counter_delta_mj`: a 64-bit wrap is modular,
  a lower reading is a reset) is spread over the window's minutes in proportion to time;
- the integral of the fast tier's ``power_w`` samples (trapezoids between consecutive samples
  no more than `MAX_GAP_S` apart), always: it fills whatever part of a minute the counter does
  not cover (a GPU without the counter, a reset window, the time before the first reading).

A counter window that the counter cannot measure (a reset) takes the exact integral of the
power samples between its two readings instead (``fallback_j``). A minute's energy is
``window_j + power_j * max(0, power_s - window_s) / power_s`` (`minute_joules`): the
proportional share of the power integral fills only time no window covers.
The power segments of an in-service GPU whose utilisation is below the
policy's ``idle_util_pct`` also count as idle (``idle_j``, ``idle_s``): the idle waste.

Everything here runs on the writer thread, after the batch's transaction committed (a replayed
batch is a duplicate and never reaches it), with numpy over each sample group: no per-sample
Python objects. `take` hands the accumulated minutes and the counter readings they account
for to the periodic flush (`gpufleet.control.energy_store`), which persists both in one
transaction; after a restart the next counter reading's window starts at the persisted one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpufleet.control.telemetry_store import FIELD_INDEX, SampleGroup
from gpufleet.energy.counter import COUNTER_MAX, counter_delta_mj

MAX_GAP_S = 120.0  # power samples further apart are not integrated across (the gap is unknown)
MAX_WINDOW_S = 31 * 86400.0  # a longer counter window (node away a month) is not spread
_PW = FIELD_INDEX["power_w"]
_UT = FIELD_INDEX["gpu_util_pct"]
HISTORY_S = 900.0  # power integral kept per GPU for fallback windows (a few counter windows)
# bucket columns: counter windows (joules, seconds covered, joules of them from power), the
# power integral of every sample (joules, seconds), its idle part (joules, seconds)
WINDOW_J, WINDOW_S, FALLBACK_J, POWER_J, POWER_S, IDLE_J, IDLE_S = range(7)
COLUMNS = ("window_j", "window_s", "fallback_j", "power_j", "power_s", "idle_j", "idle_s")

Readings = Sequence[tuple[int, Sequence[float], Sequence[float | None]]]
Key = tuple[str, int]


def minute_joules(window_j: float, window_s: float, power_j: float, power_s: float) -> float:
    """A minute's energy: its counter windows', plus the power integral's share of the time
    no window covered."""
    if power_s <= 0.0 or power_s <= window_s:
        return window_j
    return window_j + power_j * (power_s - window_s) / power_s


@dataclass
class _GpuState:
    counter_t: float = -math.inf
    counter_mj: float | None = None
    power_t: float = -math.inf
    power_w: float = math.nan
    util: float = math.nan
    cum_j: float = 0.0  # running integral of power (J) and its recent history, for fallbacks
    hist_t: list[np.ndarray] = field(default_factory=list)
    hist_c: list[np.ndarray] = field(default_factory=list)

    def power_between(self, t0: float, t1: float) -> float | None:
        """Joules of the power integral from ``t0`` to ``t1``; None when the history does not
        reach back to ``t0`` or forward to ``t1``."""
        if not self.hist_t or self.hist_t[0][0] > t0 or self.hist_t[-1][-1] < t1:
            return None
        t = np.concatenate(self.hist_t)
        c = np.concatenate(self.hist_c)
        return float(np.interp(t1, t, c) - np.interp(t0, t, c))

    def remember(self, t: np.ndarray, c: np.ndarray) -> None:
        if self.hist_t and t[0] <= self.hist_t[-1][-1]:
            keep = t > self.hist_t[-1][-1]
            t, c = t[keep], c[keep]
            if not len(t):
                return
        self.hist_t.append(t)
        self.hist_c.append(c)
        cutoff = t[-1] - HISTORY_S
        while len(self.hist_t) > 1 and self.hist_t[1][0] <= cutoff:
            del self.hist_t[0], self.hist_c[0]


@dataclass(frozen=True)
class Taken:
    """What one flush persists: minute buckets and the counter readings they account for."""

    minutes: dict[tuple[str, int, int], list[float]]
    labels: dict[Key, tuple[str | None, str | None]]  # (tenant, model) per GPU
    counters: dict[Key, tuple[float, float]]  # (t, mJ) per GPU


class EnergyLedger:
    """Per-GPU counter and power state plus the minutes not yet flushed (writer thread only)."""

    def __init__(self) -> None:
        self._gpus: dict[Key, _GpuState] = {}
        self._minutes: dict[tuple[str, int, int], list[float]] = {}
        self._labels: dict[Key, tuple[str | None, str | None]] = {}
        self._counters_dirty: set[Key] = set()
        self.windows = {"counter": 0, "power": 0}  # counter windows by how they were measured

    def restore(self, counters: Iterable[tuple[str, int, float, float]]) -> None:
        """The persisted counter readings (node, gpu, t, mJ), at start."""
        for node, gpu, t, mj in counters:
            st = self._state((node, gpu))
            st.counter_t, st.counter_mj = t, mj

    def _state(self, key: Key) -> _GpuState:
        st = self._gpus.get(key)
        if st is None:
            st = self._gpus[key] = _GpuState()
        return st

    def _bucket(self, node: str, gpu: int, minute_s: int) -> list[float]:
        k = (node, gpu, minute_s)
        b = self._minutes.get(k)
        if b is None:
            b = self._minutes[k] = [0.0] * len(COLUMNS)
        return b

    def forget(self, node: str) -> None:
        """A node removed from the fleet: drop its state (its minutes stay until flushed)."""
        for key in [k for k in self._gpus if k[0] == node]:
            del self._gpus[key]

    # -- power samples ---------------------------------------------------------------------
    def add_groups(
        self,
        node: str,
        groups: Sequence[SampleGroup],
        *,
        in_service: bool,
        idle_util_pct: float,
        labels: dict[int, tuple[str | None, str | None]],
    ) -> None:
        """Integrate the power samples of one batch's sample groups."""
        for g in groups:
            self._add_group(node, g, in_service, idle_util_pct, labels)

    def _add_group(
        self,
        node: str,
        g: SampleGroup,
        in_service: bool,
        idle_util_pct: float,
        labels: dict[int, tuple[str | None, str | None]],
    ) -> None:
        p = g.mat[:, _PW, :]
        if not bool((~np.isnan(p)).any()):
            return  # slow-tier blocks carry no power
        nb = len(g.gpus)
        states = [self._state((node, gpu)) for gpu in g.gpus]
        # prepend each GPU's previous power sample so the first segment spans the batches
        t0 = np.array([st.power_t for st in states])
        t = np.concatenate([t0[:, None], g.t], axis=1)
        pw = np.concatenate([np.array([st.power_w for st in states])[:, None], p], axis=1)
        ut = np.concatenate(
            [np.array([st.util for st in states])[:, None], g.mat[:, _UT, :]], axis=1
        )
        have = ~np.isnan(pw)
        # carry each GPU's newest power sample forward over the missing ones (index of last
        # present sample at or before each column)
        idx = np.where(have, np.arange(t.shape[1])[None, :], -1)
        np.maximum.accumulate(idx, axis=1, out=idx)
        rows = np.arange(nb)[:, None]
        ok = idx >= 0
        safe = np.maximum(idx, 0)
        tp, pp, up = t[rows, safe], pw[rows, safe], ut[rows, safe]
        # segments between consecutive present samples: column j>0 with a present sample
        seg = have[:, 1:] & ok[:, :-1]
        prev_t, prev_p, prev_u = tp[:, :-1], pp[:, :-1], up[:, :-1]
        cur_t, cur_p = t[:, 1:], pw[:, 1:]
        with np.errstate(invalid="ignore"):
            dt = cur_t - prev_t
            seg &= (dt > 0.0) & (dt <= MAX_GAP_S)
            e = np.where(seg, (prev_p + cur_p) * 0.5 * dt, 0.0)
            dts = np.where(seg, dt, 0.0)
            idle = seg & (prev_u < idle_util_pct) if in_service else np.zeros_like(seg)
        ie = np.where(idle, e, 0.0)
        ids = np.where(idle, dt, 0.0)
        if bool(seg.any()):
            minutes = (np.floor(np.where(seg, prev_t, 0.0) / 60.0) * 60.0).astype(np.int64)
            for m in np.unique(minutes[seg]).tolist():
                inside = seg & (minutes == m)
                sums = (
                    np.where(inside, e, 0.0).sum(axis=1),
                    np.where(inside, dts, 0.0).sum(axis=1),
                    np.where(inside, ie, 0.0).sum(axis=1),
                    np.where(inside, ids, 0.0).sum(axis=1),
                )
                for r in np.flatnonzero(inside.any(axis=1)).tolist():
                    gpu = g.gpus[r]
                    b = self._bucket(node, gpu, int(m))
                    b[POWER_J] += float(sums[0][r])
                    b[POWER_S] += float(sums[1][r])
                    b[IDLE_J] += float(sums[2][r])
                    b[IDLE_S] += float(sums[3][r])
                    self._labels[(node, gpu)] = labels.get(gpu, (None, None))
        # running integral at each sample, for the windows the counter cannot measure
        cum = np.cumsum(e, axis=1)
        for r, st in enumerate(states):
            present = have[r, 1:]
            if bool(present.any()):
                st.remember(cur_t[r][present], st.cum_j + cum[r][present])
                st.cum_j += float(cum[r, -1])
        # newest present sample of each GPU becomes its state (only when newer)
        last = idx[:, -1]
        for r, st in enumerate(states):
            j = int(last[r])
            if j > 0 and t[r, j] > st.power_t:
                st.power_t, st.power_w, st.util = float(t[r, j]), float(pw[r, j]), float(ut[r, j])

    # -- counter readings --------------------------------------------------------------------
    def add_readings(
        self, node: str, readings: Readings, labels: dict[int, tuple[str | None, str | None]]
    ) -> None:
        """Counter readings of one batch: (GPU index, times, mJ values or None)."""
        for gpu, ts, vals in readings:
            key = (node, gpu)
            st = self._state(key)
            pairs = sorted(
                (float(t), float(v))
                for t, v in zip(ts, vals, strict=False)
                if v is not None and 0.0 <= v <= COUNTER_MAX and math.isfinite(t)
            )
            for t, mj in pairs:
                if t <= st.counter_t:
                    continue  # older than what is accounted (out of order): already covered
                if st.counter_mj is not None:
                    # float64 near the top rounds to 2**64 itself: modulo keeps it a counter value
                    delta = counter_delta_mj(
                        int(st.counter_mj) % COUNTER_MAX, int(mj) % COUNTER_MAX
                    )
                    span = t - st.counter_t
                    if delta is not None and 0.0 < span <= MAX_WINDOW_S:
                        self._spread(node, gpu, st.counter_t, t, delta / 1000.0, False)
                        self.windows["counter"] += 1
                    elif 0.0 < span <= MAX_WINDOW_S:  # reset: the window from power samples
                        joules = st.power_between(st.counter_t, t)
                        if joules is not None:
                            self._spread(node, gpu, st.counter_t, t, joules, True)
                        self.windows["power"] += 1
                st.counter_t, st.counter_mj = t, mj
                self._counters_dirty.add(key)
                self._labels[key] = labels.get(gpu, (None, None))

    def _spread(
        self, node: str, gpu: int, t0: float, t1: float, joules: float, fallback: bool
    ) -> None:
        span = t1 - t0
        m = math.floor(t0 / 60.0) * 60
        while m < t1:
            lo, hi = max(t0, m), min(t1, m + 60)
            if hi > lo:
                b = self._bucket(node, gpu, int(m))
                part = joules * (hi - lo) / span
                b[WINDOW_J] += part
                b[WINDOW_S] += hi - lo
                if fallback:
                    b[FALLBACK_J] += part
            m += 60

    # -- flush -------------------------------------------------------------------------------
    def take(self) -> Taken:
        """Hand over the accumulated minutes and the counter readings they account for."""
        minutes, self._minutes = self._minutes, {}
        counters: dict[Key, tuple[float, float]] = {}
        for key in self._counters_dirty:
            st = self._gpus.get(key)
            if st is not None and st.counter_mj is not None:
                counters[key] = (st.counter_t, st.counter_mj)
        self._counters_dirty = set()
        return Taken(minutes, dict(self._labels), counters)

    def give_back(self, taken: Taken) -> None:
        """A flush that failed: its minutes merge back in to be written next time."""
        for k, vals in taken.minutes.items():
            b = self._bucket(*k)
            for i, v in enumerate(vals):
                b[i] += v
        self._counters_dirty |= set(taken.counters)

    @property
    def pending(self) -> int:
        return len(self._minutes)
