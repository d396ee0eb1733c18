"""Recent telemetry in memory: one fixed-size numeric ring buffer per GPU, plus per-minute
rollup accumulators that the service persists once a minute has closed (by the clock, within
its flush period of 2 s; samples of a closed minute that arrive later start a fresh accumulator
of that minute, merged into the stored row at the next flush).

Nothing here touches the database; raw samples are never persisted (at scale Prometheus holds
the history, DESIGN.md "Storage and scale"). Values are float32 (7 significant digits; enough
for a dashboard), timestamps float64.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# The metrics kept per GPU (names of `gpufleet.devices.types.Sample` fields, as on the wire).
FIELDS: tuple[str, ...] = (
    "gpu_util_pct",
    "mem_util_pct",
    "power_w",
    "gpu_temp_c",
    "mem_temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "mem_used_bytes",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "clock_event_reasons",
    "ecc_dbe_volatile",
)
FIELD_INDEX = {f: i for i, f in enumerate(FIELDS)}
NF = len(FIELDS)
DEFAULT_CAPACITY = 256  # samples per GPU: ~4 min at 1 Hz, ~8.5 min at 0.5 Hz
Mat = npt.NDArray[np.float64]
Index = slice | npt.NDArray[np.int64]  # rows of GPUs: consecutive (a slice) or not


class SampleShapeError(ValueError):
    """A columnar sample block whose columns do not match its timestamps."""


class _NodeRings:
    """The ring buffers of one node's GPUs as arrays indexed by GPU (rows grow on demand)."""

    def __init__(self, cap: int, gpus: int) -> None:
        self.cap = cap
        self.t = np.full((gpus, cap), np.nan)
        self.v = np.full((gpus, cap, NF), np.nan, dtype=np.float32)
        self.n = np.zeros(gpus, dtype=np.int64)
        self.last_t = np.full(gpus, -np.inf)
        self.last = np.full((gpus, NF), np.nan, dtype=np.float32)

    @property
    def gpus(self) -> int:
        return int(self.n.shape[0])

    def grow(self, gpus: int) -> None:
        extra = gpus - self.gpus
        if extra <= 0:
            return
        self.t = np.concatenate([self.t, np.full((extra, self.cap), np.nan)])
        self.v = np.concatenate([self.v, np.full((extra, self.cap, NF), np.nan, np.float32)])
        self.n = np.concatenate([self.n, np.zeros(extra, dtype=np.int64)])
        self.last_t = np.concatenate([self.last_t, np.full(extra, -np.inf)])
        self.last = np.concatenate([self.last, np.full((extra, NF), np.nan, np.float32)])

    def write(self, g: Index, t: Mat, mat: Mat) -> None:
        """Append ``t`` (B, k) and ``mat`` (B, NF, k) to the rings of GPUs ``g`` (distinct;
        a slice when they are consecutive, the common case, which avoids fancy indexing)."""
        k = t.shape[1]
        if k > self.cap:
            t, mat, k = t[:, -self.cap :], mat[:, :, -self.cap :], self.cap
        n = self.n[g]
        n0 = int(n[0])
        start = n0 % self.cap
        if isinstance(g, slice) and start + k <= self.cap and bool((n == n0).all()):
            self.t[g, start : start + k] = t
            self.v[g, start : start + k] = mat.transpose(0, 2, 1)
        else:
            pos = (n[:, None] + np.arange(k)[None, :]) % self.cap
            rows = np.arange(self.gpus)[g][:, None]
            self.t[rows, pos] = t
            self.v[rows, pos] = mat.transpose(0, 2, 1)
        self.n[g] += k
        ordered = k == 1 or bool((t[:, 1:] >= t[:, :-1]).all())
        if not ordered:
            order = np.argsort(t, axis=1)
            t = np.take_along_axis(t, order, axis=1)
            mat = np.take_along_axis(mat, order[:, None, :], axis=2)
        tmax = t[:, -1]
        # newest non-missing value of each field (slow fields come less often); a field with
        # no value in these blocks keeps its last one
        newest = mat[:, :, -1]
        gaps = np.isnan(newest)
        if bool(gaps.any()):
            if k > 1:
                idx = k - 1 - np.argmax(~np.isnan(mat[:, :, ::-1]), axis=2)
                b, f = np.indices(idx.shape, sparse=True)
                newest = mat[b, f, idx]
                gaps = np.isnan(newest)
            newest = np.where(gaps, self.last[g], newest)
        newer = tmax >= self.last_t[g]
        if bool(newer.all()):
            self.last[g] = newest
            self.last_t[g] = tmax
        elif bool(newer.any()):
            rows = np.arange(self.gpus)[g][newer]
            self.last[rows] = newest[newer]
            self.last_t[rows] = tmax[newer]


@dataclass(frozen=True)
class SampleGroup:
    """Sample blocks of distinct GPUs of one batch with the same number of samples, as arrays:
    ``t`` is (B, k), ``mat`` (B, NF, k) float64 with NaN for missing (see `clean_matrix`)."""

    gpus: list[int]
    t: Mat
    mat: Mat


def clean_matrix(mat: Mat) -> Mat:
    """NaN for readings that are no readings: infinities and values beyond float32 (they
    would become infinities in the ring). Works in place and returns ``mat``."""
    bad = ~(np.abs(mat) <= 3.0e38)  # NaN, infinities and huge values alike
    if bool(bad.any()):
        mat[bad] = np.nan
    return mat


def _matrix(k: int, fields: dict[str, list[float | None]]) -> npt.NDArray[np.float64]:
    none_row: list[float | None] = [None] * k
    rows = []
    for name in FIELDS:
        col = fields.get(name)
        if col is None:
            rows.append(none_row)
            continue
        if len(col) != k:
            raise SampleShapeError(f"fields[{name!r}] has {len(col)} values for {k} timestamps")
        rows.append(col)
    return clean_matrix(np.array(rows, dtype=np.float64).reshape(NF, k))


class TelemetryStore:
    """Ring buffers per node (one row per GPU) and rollup accumulators keyed by minute.

    Writes are vectorised over the GPUs of a batch: one batch of 8 GPUs is a handful of numpy
    operations, not 8 times as many."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._rings: dict[str, _NodeRings] = {}
        # (node, minute) -> array (gpus, 4, NF): count, min, max, sum
        self._acc: dict[tuple[str, int], Mat] = {}
        self._lock = threading.Lock()
        self.samples_total = 0

    @staticmethod
    def check(t: Sequence[float], fields: dict[str, list[float | None]]) -> None:
        """Raise SampleShapeError when any column's length differs from ``t``'s."""
        k = len(t)
        for name, col in fields.items():
            if len(col) != k:
                raise SampleShapeError(f"fields[{name!r}] has {len(col)} values for {k} timestamps")

    def add(
        self, node: str, gpu: int, t: Sequence[float], fields: dict[str, list[float | None]]
    ) -> int:
        """Store one GPU's columnar block; returns the number of samples."""
        k = len(t)
        if k == 0:
            return 0
        return self.add_arrays(node, gpu, np.asarray(t, dtype=np.float64), _matrix(k, fields))

    @staticmethod
    def matrix(k: int, fields: dict[str, list[float | None]]) -> Mat:
        """The kept metrics of a columnar block as an (NF, k) float64 matrix (NaN: missing)."""
        return _matrix(k, fields)

    def add_arrays(self, node: str, gpu: int, tarr: Mat, mat: Mat) -> int:
        """Store one GPU's block given as arrays (see `matrix`); returns the sample count."""
        return self.add_blocks(node, [gpu], tarr[None, :], mat[None, :, :])

    def add_groups(self, node: str, groups: Sequence[SampleGroup]) -> int:
        """Store every sample group of one batch; returns the sample count."""
        return sum(self.add_blocks(node, g.gpus, g.t, g.mat) for g in groups)

    def add_blocks(self, node: str, gpus: Sequence[int], t: Mat, mat: Mat) -> int:
        """Store blocks of several distinct GPUs of one node with the same number of samples:
        ``t`` is (B, k), ``mat`` (B, NF, k) (see `clean_matrix`); returns the sample count."""
        nb, k = int(t.shape[0]), int(t.shape[1])
        if nb == 0 or k == 0:
            return 0
        g0 = gpus[0]
        g: Index
        if list(gpus) == list(range(g0, g0 + nb)):
            g, need = slice(g0, g0 + nb), g0 + nb
        else:
            g = np.asarray(gpus, dtype=np.int64)
            need = int(g.max()) + 1
        m0, m1 = math.floor(float(t.min()) / 60.0), math.floor(float(t.max()) / 60.0)
        with self._lock:
            ring = self._rings.get(node)
            if ring is None:
                ring = self._rings[node] = _NodeRings(self.capacity, need)
            ring.grow(need)
            ring.write(g, t, mat)
            if m0 == m1:
                self._accumulate(node, m0, g, need, mat)
            else:
                minutes = np.floor(t / 60.0).astype(np.int64)
                for m in np.unique(minutes).tolist():
                    inside = (minutes == m)[:, None, :]
                    self._accumulate(node, int(m), g, need, np.where(inside, mat, np.nan))
            self.samples_total += nb * k
        return nb * k

    def _accumulate(self, node: str, minute: int, g: Index, need: int, sub: Mat) -> None:
        present = ~np.isnan(sub)
        if not bool(present.any()):  # blocks without a kept metric (slow-tier rows): no change
            return
        key = (node, minute)
        acc = self._acc.get(key)
        if acc is None or acc.shape[0] < need:
            acc = self._acc[key] = _widened(acc, need)
        a = acc[g]  # a view for a slice; a copy (written back below) for an index array
        a[:, 0] += present.sum(axis=2)
        np.fmin(a[:, 1], np.fmin.reduce(sub, axis=2), out=a[:, 1])
        np.fmax(a[:, 2], np.fmax.reduce(sub, axis=2), out=a[:, 2])
        a[:, 3] += np.where(present, sub, 0.0).sum(axis=2)
        if not isinstance(g, slice):
            acc[g] = a

    # -- reads ------------------------------------------------------------------------------
    def read_since(
        self, node: str, since: npt.NDArray[np.int64] | None, fields: Sequence[int]
    ) -> tuple[Mat, Mat, npt.NDArray[np.int64]] | None:
        """The samples of ``node``'s GPUs written after the per-GPU sample counts ``since``,
        in write order (the energy ledger reads power this way, in bulk): times (G, m) and
        the ``fields`` columns (G, len(fields), m), NaN where a GPU has fewer; and the counts
        now. What the ring overwrote meanwhile is gone (at most ``capacity`` per GPU)."""
        with self._lock:
            ring = self._rings.get(node)
            if ring is None:
                return None
            n = ring.n.copy()
            g, cap = ring.gpus, ring.cap
            s = np.zeros(g, dtype=np.int64)
            if since is not None:
                s[: min(g, len(since))] = since[:g]
            s = np.maximum(s, n - cap)
            m = int((n - s).max()) if g else 0
            if m <= 0:
                return np.empty((g, 0)), np.empty((g, len(fields), 0)), n
            pos = s[:, None] + np.arange(m)[None, :]
            valid = pos < n[:, None]
            idx = pos % cap
            rows = np.arange(g)[:, None]
            t = np.where(valid, ring.t[rows, idx], np.nan)
            v = ring.v[rows, idx][:, :, list(fields)].astype(np.float64).transpose(0, 2, 1)
        return t, np.where(valid[:, None, :], v, np.nan), n

    def _ring(self, node: str, gpu: int) -> _NodeRings | None:
        ring = self._rings.get(node)
        if ring is None or not 0 <= gpu < ring.gpus or ring.n[gpu] == 0:
            return None
        return ring

    def latest(self, node: str, gpu: int) -> tuple[float | None, dict[str, float | None]]:
        """The newest sample of one GPU (by timestamp) as ``(t, {field: value})``."""
        with self._lock:
            ring = self._ring(node, gpu)
            if ring is None:
                return None, {}
            vals = ring.last[gpu].tolist()
            t = float(ring.last_t[gpu])
        return t, {f: (v if math.isfinite(v) else None) for f, v in zip(FIELDS, vals, strict=True)}

    def latest_field(
        self, node: str, gpus: int, name: str, *, stale_s: float | None = None
    ) -> list[float | None]:
        """One metric's newest value for GPUs 0..gpus-1 of a node (heatmap row). With
        ``stale_s``, a GPU whose newest sample is more than that behind the node's newest one
        (it stopped answering: fallen off the bus, hung) has no value rather than its last."""
        j = FIELD_INDEX[name]
        with self._lock:
            ring = self._rings.get(node)
            have = 0 if ring is None else min(gpus, ring.gpus)
            vals = ring.last[:have, j].tolist() if ring is not None else []
            seen = ring.last_t[:have].tolist() if ring is not None else []
        out: list[float | None] = [v if math.isfinite(v) else None for v in vals]
        if stale_s is not None and seen:
            newest = max(seen)
            out = [None if newest - t > stale_s else v for v, t in zip(out, seen, strict=True)]
        return out + [None] * (gpus - have)

    def latest_many(
        self,
        nodes: Sequence[tuple[str, int]],
        names: Sequence[str],
        *,
        stale_s: float | None = None,
    ) -> npt.NDArray[np.float32]:
        """The newest values of ``names`` for many nodes at once, as an array (nodes, width,
        fields) with NaN for no data; ``nodes`` are (node, width) pairs, width the GPU count to
        report (the widest sets the array's). ``stale_s`` as in `latest_field`. One lock and
        a few array copies per node: the fleet-wide reads (heatmap groups, the node table's
        sorts) at 10,000 nodes."""
        cols: list[int] | slice = [FIELD_INDEX[n] for n in names]
        if len(names) == 1:  # a basic slice: a view, no fancy-indexing copy
            cols = slice(FIELD_INDEX[names[0]], FIELD_INDEX[names[0]] + 1)
        width = max((w for _, w in nodes), default=0)
        out = np.full((len(nodes), width, len(names)), np.nan, dtype=np.float32)
        seen = np.full((len(nodes), width), -np.inf)
        rings = self._rings
        with self._lock:
            for i, (node, w) in enumerate(nodes):
                ring = rings.get(node)
                if ring is None:
                    continue
                last = ring.last
                have = min(w, last.shape[0])
                out[i, :have] = last[:have, cols]
                seen[i, :have] = ring.last_t[:have]
        if stale_s is not None and width:
            newest = seen.max(axis=1, keepdims=True)
            out[(newest - seen) > stale_s] = np.nan
        return out

    def series(
        self, node: str, gpu: int, names: Sequence[str], since_s: float | None = None
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Recent raw samples of one GPU, oldest first."""
        with self._lock:
            ring = self._ring(node, gpu)
            if ring is None:
                return [], {n: [] for n in names}
            k = min(int(ring.n[gpu]), ring.cap)
            t = ring.t[gpu, :k].copy()
            v = ring.v[gpu, :k].copy()
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        if since_s is not None:
            keep = t >= since_s
            t, v = t[keep], v[keep]
        cols: dict[str, list[float | None]] = {}
        for name in names:
            col = v[:, FIELD_INDEX[name]].astype(np.float64)
            cols[name] = [x if math.isfinite(x) else None for x in col.tolist()]
        return t.tolist(), cols

    # -- rollups ----------------------------------------------------------------------------
    def take_closed(
        self, now_s: float, *, all_minutes: bool = False, max_rows: int | None = None
    ) -> tuple[list[ClosedMinute], bool]:
        """Remove and return the accumulators of the minutes that have ended by ``now_s`` (all
        of them when ``all_minutes``, at shutdown), and whether closed ones are left (with
        ``max_rows``: stop once the taken ones hold that many GPU rows). A sample of such a
        minute that comes later starts a fresh accumulator of it: the next take returns only
        what came since."""
        taken: list[ClosedMinute] = []
        rows = 0
        with self._lock:
            for k in [k for k in self._acc if all_minutes or (k[1] + 1) * 60 <= now_s]:
                if max_rows is not None and rows >= max_rows:
                    return taken, True
                acc = self._acc.pop(k)
                taken.append(ClosedMinute(k[0], k[1], acc))
                rows += acc.shape[0]
        return taken, False

    def put_back(self, closed: Sequence[ClosedMinute]) -> None:
        """Merge taken accumulators back (their write failed: the next flush tries again)."""
        with self._lock:
            for cm in closed:
                key = (cm.node, cm.minute)
                acc = _widened(self._acc.get(key), cm.acc.shape[0])
                _combine(acc[: cm.acc.shape[0]], cm.acc)
                self._acc[key] = acc

    def take_closed_minutes(
        self, now_s: float, *, all_minutes: bool = False
    ) -> list[tuple[str, int, int, int, dict[str, list[float]]]]:
        """`take_closed` as rows: ``(node, gpu, minute_s, samples, {field: [count, min, mean,
        max]})``."""
        taken, _more = self.take_closed(now_s, all_minutes=all_minutes)
        return [row for cm in taken for row in cm.rows()]


def _widened(acc: Mat | None, gpus: int) -> Mat:
    """``acc`` (or nothing) as an accumulator of at least ``gpus`` rows, the new rows empty
    (count 0, min +inf, max -inf, sum 0)."""
    if acc is not None and acc.shape[0] >= gpus:
        return acc
    fresh = np.empty((gpus, 4, NF))
    fresh[:, 0] = 0.0
    fresh[:, 1] = np.inf
    fresh[:, 2] = -np.inf
    fresh[:, 3] = 0.0
    if acc is not None:
        fresh[: acc.shape[0]] = acc
    return fresh


def _combine(into: Mat, other: Mat) -> None:
    """Add accumulator ``other`` to ``into`` (same shape), in place: counts and sums add,
    minima and maxima combine."""
    into[:, 0] += other[:, 0]
    np.minimum(into[:, 1], other[:, 1], out=into[:, 1])
    np.maximum(into[:, 2], other[:, 2], out=into[:, 2])
    into[:, 3] += other[:, 3]


@dataclass(frozen=True)
class ClosedMinute:
    """One node's accumulators of one closed minute, taken out of memory to be written:
    ``acc`` is (gpus, 4, NF): count, min, max and sum of each kept metric."""

    node: str
    minute: int  # minutes since the epoch (minute_s // 60)
    acc: Mat

    def rows(self) -> list[tuple[str, int, int, int, dict[str, list[float]]]]:
        """``(node, gpu, minute_s, samples, {field: [count, min, mean, max]})`` for each GPU
        with a reading; ``samples`` is the count of the metric read most often."""
        out = []
        for gpu in range(self.acc.shape[0]):
            stats: dict[str, list[float]] = {}
            n = 0
            a = self.acc[gpu]
            for j, name in enumerate(FIELDS):
                c = int(a[0, j])
                if c:
                    stats[name] = [c, float(a[1, j]), float(a[3, j] / c), float(a[2, j])]
                    n = max(n, c)
            if stats:
                out.append((self.node, gpu, self.minute * 60, n, stats))
        return out

    def without(self, gpus: set[int]) -> ClosedMinute:
        """A copy with the accumulators of ``gpus`` emptied."""
        acc = self.acc.copy()
        for g in gpus:
            acc[g] = _widened(None, 1)[0]
        return ClosedMinute(self.node, self.minute, acc)


def merge_stats(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    """Combine two rollups of the same minute (a stored one and the samples that came after
    it was written: late ones, another replica's, another process's before a restart)."""
    out = dict(a)
    for name, (c2, mn2, mean2, mx2) in b.items():
        if name not in out:
            out[name] = [c2, mn2, mean2, mx2]
            continue
        c1, mn1, mean1, mx1 = out[name]
        c = c1 + c2
        out[name] = [c, min(mn1, mn2), (mean1 * c1 + mean2 * c2) / c, max(mx1, mx2)]
    return out
