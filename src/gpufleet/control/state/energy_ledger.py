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

Everything here runs on the writer thread, off ingest's hot path: ingest only queues the counter
readings of committed batches (a replayed batch is a duplicate and never reaches it); the periodic
flush (`gpufleet.control.state.energy_store`, every 15 s) calls `integrate`, which reads each node's
new power samples from the telemetry store's rings in bulk (numpy over the node's GPUs, per-node
arrays of state and minute sums: no per-sample or per-GPU Python objects), then accounts the queued
readings, and `take` hands the minutes and the counter readings they account for to be persisted in
one transaction; after a restart the next counter reading's window starts at the persisted one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpufleet.control.state.rings import FIELD_INDEX, TelemetryStore
from gpufleet.energy.counter import COUNTER_MAX, counter_delta_mj
from gpufleet.wire.limits import SAMPLE_RANGES

MAX_GAP_S = 120.0  # power samples further apart are not integrated across (the gap is unknown)
MAX_WINDOW_S = 31 * 86400.0  # a longer counter window (node away a month) is not spread
# a counter window implying more than the wire's highest power (no GPU module draws 10 kW) is
# not trusted: power fills it, as for a reset
MAX_POWER_W = SAMPLE_RANGES["power_w"][1]
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


NP = len(COLUMNS)
Mat = npt.NDArray[np.float64]


class _NodePower:
    """One node's power state as arrays indexed by GPU: the newest sample (time, watts,
    utilisation) and the running power integral; its recent history (chunks of sample times
    and integrals, per group of GPUs) for fallback windows; its unflushed minutes."""

    def __init__(self, gpus: int) -> None:
        self.t = np.full(gpus, -np.inf)
        self.w = np.full(gpus, np.nan)
        self.u = np.full(gpus, np.nan)
        self.cum = np.zeros(gpus)
        self.hist: list[tuple[npt.NDArray[np.intp], Mat, Mat]] = []  # (gpus, t, cumulative J)
        self.minutes: dict[int, Mat] = {}  # minute -> (gpus, NP)
        self.labels: dict[int, tuple[str | None, str | None]] = {}

    def grow(self, gpus: int) -> None:
        extra = gpus - len(self.t)
        if extra > 0:
            self.t = np.concatenate([self.t, np.full(extra, -np.inf)])
            self.w = np.concatenate([self.w, np.full(extra, np.nan)])
            self.u = np.concatenate([self.u, np.full(extra, np.nan)])
            self.cum = np.concatenate([self.cum, np.zeros(extra)])

    def bucket(self, minute: int, gpus: int) -> Mat:
        b = self.minutes.get(minute)
        if b is None:
            b = self.minutes[minute] = np.zeros((max(gpus, len(self.t)), NP))
        elif b.shape[0] < gpus:
            b = self.minutes[minute] = np.concatenate([b, np.zeros((gpus - b.shape[0], NP))])
        return b

    def remember(self, g: npt.NDArray[np.intp], t: Mat, cum: Mat) -> None:
        self.hist.append((g, t, cum))
        cutoff = _newest(t) - HISTORY_S  # rows without samples are NaN: ignored
        while len(self.hist) > 1 and _newest(self.hist[0][1]) < cutoff:
            del self.hist[0]

    def power_between(self, gpu: int, t0: float, t1: float) -> float | None:
        """Joules of GPU ``gpu``'s power integral from ``t0`` to ``t1``; None when the
        history does not reach back to ``t0`` or forward to ``t1``."""
        ts, cs = [], []
        for g, t, c in self.hist:
            rows = np.flatnonzero(g == gpu)
            if len(rows):
                ts.append(t[rows[0]])
                cs.append(c[rows[0]])
        if not ts:
            return None
        t = np.concatenate(ts)
        c = np.concatenate(cs)
        keep = ~np.isnan(t)
        t, c = t[keep], c[keep]
        if not len(t):
            return None
        order = np.argsort(t, kind="stable")
        t, c = t[order], c[order]
        if t[0] > t0 or t[-1] < t1:
            return None
        return float(np.interp(t1, t, c) - np.interp(t0, t, c))


@dataclass(frozen=True)
class Taken:
    """What one flush persists: minute buckets and the counter readings they account for."""

    minutes: dict[tuple[str, int, int], list[float]]
    labels: dict[Key, tuple[str | None, str | None]]  # (tenant, model) per GPU
    counters: dict[Key, tuple[float, float]]  # (t, mJ) per GPU


class EnergyLedger:
    """Per-node power state, per-GPU counter state and the minutes not yet flushed (writer
    thread only)."""

    def __init__(self) -> None:
        self._nodes: dict[str, _NodePower] = {}
        self._counter: dict[Key, tuple[float, float]] = {}  # (t, mJ) of the newest reading
        self._counters_dirty: set[Key] = set()
        self._cursor: dict[str, npt.NDArray[np.int64]] = {}  # telemetry ring counts read
        self._queued: list[tuple[str, Readings]] = []
        self.windows = {"counter": 0, "power": 0}  # counter windows by how they were measured

    def restore(self, counters: Iterable[tuple[str, int, float, float]]) -> None:
        """The persisted counter readings (node, gpu, t, mJ), at start."""
        for node, gpu, t, mj in counters:
            self._counter[(node, gpu)] = (t, mj)

    def queued_nodes(self) -> set[str]:
        """Nodes whose counter readings wait for the next `integrate`."""
        return {node for node, _ in self._queued}

    def merge_newer(self, counters: Iterable[tuple[str, int, float, float]]) -> int:
        """Counter readings another replica accounted (node, gpu, t, mJ): each one newer than
        this ledger's becomes the start of the next window, so a window an agent pushed to the
        other replica is not counted again here. Returns how many were taken."""
        taken = 0
        for node, gpu, t, mj in counters:
            cur = self._counter.get((node, gpu))
            if cur is None or t > cur[0]:
                self._counter[(node, gpu)] = (t, mj)
                self._counters_dirty.discard((node, gpu))
                taken += 1
        return taken

    def _node(self, node: str, gpus: int) -> _NodePower:
        np_ = self._nodes.get(node)
        if np_ is None:
            np_ = self._nodes[node] = _NodePower(gpus)
        np_.grow(gpus)
        return np_

    def forget(self, node: str) -> None:
        """A node removed from the fleet: drop its power state."""
        self._nodes.pop(node, None)
        self._cursor.pop(node, None)

    # -- power samples ---------------------------------------------------------------------
    def integrate(
        self,
        telemetry: TelemetryStore,
        nodes: dict[str, tuple[bool, dict[int, tuple[str | None, str | None]]]],
        idle_util_pct: float,
    ) -> None:
        """Integrate the power samples the telemetry store received since the last call, for
        every node in ``nodes`` (name -> (in service, (tenant, model) per GPU)), then the
        counter readings queued meanwhile (their fallback windows need that integral)."""
        for node, (in_service, labels) in nodes.items():
            got = telemetry.read_since(node, self._cursor.get(node), (_PW, _UT))
            if got is None:
                continue
            t, v, self._cursor[node] = got
            if t.shape[1]:
                gpus = np.arange(t.shape[0], dtype=np.intp)
                self._add(node, gpus, t, v[:, 0, :], v[:, 1, :], in_service, idle_util_pct)
            self._node(node, t.shape[0]).labels = labels
        queued, self._queued = self._queued, []
        for node, readings in queued:
            self.add_readings(node, readings)

    def queue_readings(self, node: str, readings: Readings) -> None:
        """Counter readings of one batch, accounted at the next `integrate` (cheap: ingest)."""
        self._queued.append((node, readings))

    def _add(
        self,
        node: str,
        gi: npt.NDArray[np.intp],
        t: Mat,
        p: Mat,
        u: Mat,
        in_service: bool,
        idle_util_pct: float,
    ) -> None:
        """Integrate power ``p`` (G, k) at times ``t`` of GPUs ``gi`` (distinct)."""
        have = ~np.isnan(p)
        cnt = have.sum(axis=1)
        if not bool(cnt.any()):
            return  # slow-tier rows carry no power
        st = self._node(node, int(gi.max()) + 1)
        if not bool(have.all()):  # each GPU's present samples first, NaN after them
            t, p, u = _compact(t, p, u, have)
        # each segment runs from the previous sample (the GPU's newest one for the first)
        pt, pw, pu = st.t[gi][:, None], st.w[gi][:, None], st.u[gi][:, None]
        t_prev = np.concatenate([pt, t[:, :-1]], axis=1)
        with np.errstate(invalid="ignore"):
            dt = t - t_prev
            e = (np.concatenate([pw, p[:, :-1]], axis=1) + p) * (0.5 * dt)
            seg = (dt > 0.0) & (dt <= MAX_GAP_S) & ~np.isnan(e)
            e = np.where(seg, e, 0.0)
            dts = np.where(seg, dt, 0.0)
            if in_service:
                idle = seg & (np.concatenate([pu, u[:, :-1]], axis=1) < idle_util_pct)
            mins = t_prev // 60.0
        if bool(seg.any()):
            ms = mins[seg]
            lo, hi = int(ms.min()), int(ms.max())
            for m in range(lo, hi + 1):
                b = st.bucket(m * 60, len(st.t))
                if lo == hi:
                    ei, di = e, dts
                else:
                    inside = seg & (mins == m)
                    ei, di = np.where(inside, e, 0.0), np.where(inside, dts, 0.0)
                b[gi, POWER_J] += ei.sum(axis=1)
                b[gi, POWER_S] += di.sum(axis=1)
                if in_service:
                    b[gi, IDLE_J] += np.where(idle, ei, 0.0).sum(axis=1)
                    b[gi, IDLE_S] += np.where(idle, di, 0.0).sum(axis=1)
        # running integral at each sample (for fallback windows), then the newest sample
        cum = np.cumsum(e, axis=1) + st.cum[gi][:, None]
        st.remember(gi, t, cum)
        st.cum[gi] = cum[:, -1]
        rows = np.arange(len(gi))
        last = np.maximum(cnt - 1, 0)
        lt = t[rows, last]
        newer = (cnt > 0) & (lt > pt[:, 0])
        if bool(newer.any()):
            upd = gi[newer]
            st.t[upd] = lt[newer]
            st.w[upd] = p[rows, last][newer]
            st.u[upd] = u[rows, last][newer]

    # -- counter readings --------------------------------------------------------------------
    def add_readings(self, node: str, readings: Readings) -> None:
        """Counter readings of one batch: (GPU index, times, mJ values or None)."""
        for gpu, ts, vals in readings:
            key = (node, gpu)
            st = self._node(node, gpu + 1)
            pairs = sorted(
                (float(t), float(v))
                for t, v in zip(ts, vals, strict=False)
                if v is not None and 0.0 <= v <= COUNTER_MAX and math.isfinite(t)
            )
            for t, mj in pairs:
                prev = self._counter.get(key)
                if prev is not None and t <= prev[0]:
                    continue  # older than what is accounted (out of order): already covered
                if prev is not None:
                    t0, mj0 = prev
                    # float64 near the top rounds to 2**64 itself: modulo keeps it a counter
                    delta = counter_delta_mj(int(mj0) % COUNTER_MAX, int(mj) % COUNTER_MAX)
                    span = t - t0
                    if delta is not None and delta / 1000.0 > MAX_POWER_W * span:
                        delta = None  # more than any GPU draws: not a reading to trust
                    if delta is not None and 0.0 < span <= MAX_WINDOW_S:
                        self._spread(st, gpu, t0, t, delta / 1000.0, False)
                        self.windows["counter"] += 1
                    elif 0.0 < span <= MAX_WINDOW_S:  # reset: the window from power samples
                        joules = st.power_between(gpu, t0, t)
                        if joules is not None:
                            self._spread(st, gpu, t0, t, joules, True)
                        self.windows["power"] += 1
                self._counter[key] = (t, mj)
                self._counters_dirty.add(key)

    @staticmethod
    def _spread(st: _NodePower, gpu: int, t0: float, t1: float, joules: float, fb: bool) -> None:
        span = t1 - t0
        m = math.floor(t0 / 60.0) * 60
        while m < t1:
            lo, hi = max(t0, m), min(t1, m + 60)
            if hi > lo:
                b = st.bucket(int(m), gpu + 1)
                part = joules * (hi - lo) / span
                b[gpu, WINDOW_J] += part
                b[gpu, WINDOW_S] += hi - lo
                if fb:
                    b[gpu, FALLBACK_J] += part
            m += 60

    # -- flush -------------------------------------------------------------------------------
    def take(self) -> Taken:
        """Hand over the accumulated minutes and the counter readings they account for."""
        minutes: dict[tuple[str, int, int], list[float]] = {}
        labels: dict[Key, tuple[str | None, str | None]] = {}
        for node, st in self._nodes.items():
            for m, b in st.minutes.items():
                for gpu in np.flatnonzero(b.any(axis=1)).tolist():
                    minutes[(node, gpu, m)] = b[gpu].tolist()
                    labels[(node, gpu)] = st.labels.get(gpu, (None, None))
            st.minutes = {}
        counters = {k: self._counter[k] for k in self._counters_dirty if k in self._counter}
        self._counters_dirty = set()
        return Taken(minutes, labels, counters)

    def give_back(self, taken: Taken) -> None:
        """A flush that failed: its minutes merge back in to be written next time."""
        for (node, gpu, m), vals in taken.minutes.items():
            st = self._node(node, gpu + 1)
            st.labels.setdefault(gpu, taken.labels.get((node, gpu), (None, None)))
            st.bucket(m, gpu + 1)[gpu] += np.asarray(vals)
        self._counters_dirty |= set(taken.counters)

    @property
    def pending(self) -> int:
        return sum(len(st.minutes) for st in self._nodes.values())


def _compact(t: Mat, p: Mat, u: Mat, have: npt.NDArray[np.bool_]) -> tuple[Mat, Mat, Mat]:
    """Each row's present power samples first (in order), NaN after them."""
    order = np.argsort(~have, axis=1, kind="stable")
    ok = np.take_along_axis(have, order, axis=1)
    tt = np.where(ok, np.take_along_axis(t, order, axis=1), np.nan)
    pp = np.where(ok, np.take_along_axis(p, order, axis=1), np.nan)
    uu = np.where(ok, np.take_along_axis(u, order, axis=1), np.nan)
    return tt, pp, uu


def _newest(t: Mat) -> float:
    """The latest time in ``t``, NaN ignored (-inf when there is none)."""
    return float(np.fmax.reduce(t.ravel(), initial=-np.inf))
