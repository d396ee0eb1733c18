"""Recent telemetry in memory: one fixed-size numeric ring buffer per GPU, plus per-minute
rollup accumulators that the service persists once a minute has closed.

Nothing here touches the database; raw samples are never persisted (at scale Prometheus holds
the history, DESIGN.md "Storage and scale"). Values are float32 (7 significant digits; enough
for a dashboard), timestamps float64.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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


class SampleShapeError(ValueError):
    """A columnar sample block whose columns do not match its timestamps."""


@dataclass
class _Ring:
    cap: int
    t: npt.NDArray[np.float64] = field(init=False)
    v: npt.NDArray[np.float32] = field(init=False)
    n: int = 0
    last_t: float = -math.inf
    last: npt.NDArray[np.float32] = field(init=False)

    def __post_init__(self) -> None:
        self.t = np.full(self.cap, np.nan)
        self.v = np.full((self.cap, NF), np.nan, dtype=np.float32)
        self.last = np.full(NF, np.nan, dtype=np.float32)

    def write(self, t: npt.NDArray[np.float64], mat: npt.NDArray[np.float64]) -> None:
        k = t.shape[0]
        if k > self.cap:
            t, mat, k = t[-self.cap :], mat[:, -self.cap :], self.cap
        idx = (self.n + np.arange(k)) % self.cap
        self.t[idx] = t
        self.v[idx] = mat.T
        self.n += k
        j = int(np.argmax(t))
        if t[j] >= self.last_t:
            # newest non-missing value of each field (slow fields come less often)
            m = mat if k == 1 or bool(np.all(np.diff(t) >= 0)) else mat[:, np.argsort(t)]
            valid = ~np.isnan(m)
            idx = k - 1 - np.argmax(valid[:, ::-1], axis=1)
            newest = m[np.arange(NF), idx].astype(np.float32)
            self.last = np.where(valid.any(axis=1), newest, self.last)
            self.last_t = float(t[j])


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
    mat = np.array(rows, dtype=np.float64).reshape(NF, k)
    mat[~np.isfinite(mat)] = np.nan  # an infinite reading is no reading
    big = np.abs(mat) > 3.0e38  # beyond float32: would become inf in the ring
    mat[big] = np.nan
    return mat


class TelemetryStore:
    """Ring buffers keyed by (node, gpu index) and rollup accumulators keyed by minute."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._rings: dict[tuple[str, int], _Ring] = {}
        # (node, gpu, minute) -> array (4, NF): count, min, max, sum
        self._acc: dict[tuple[str, int, int], npt.NDArray[np.float64]] = {}
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
    def matrix(k: int, fields: dict[str, list[float | None]]) -> npt.NDArray[np.float64]:
        """The kept metrics of a columnar block as an (NF, k) float64 matrix (NaN: missing)."""
        return _matrix(k, fields)

    def add_arrays(
        self, node: str, gpu: int, tarr: npt.NDArray[np.float64], mat: npt.NDArray[np.float64]
    ) -> int:
        """Store one GPU's block given as arrays (see `matrix`); returns the sample count."""
        k = int(tarr.shape[0])
        if k == 0:
            return 0
        minutes = np.floor(tarr / 60.0).astype(np.int64)
        with self._lock:
            ring = self._rings.get((node, gpu))
            if ring is None:
                ring = self._rings[(node, gpu)] = _Ring(self.capacity)
            ring.write(tarr, mat)
            m0, m1 = int(minutes.min()), int(minutes.max())
            groups: Iterable[tuple[int, npt.NDArray[np.float64]]]
            if m0 == m1:
                groups = ((m0, mat),)
            else:
                groups = ((int(m), mat[:, minutes == m]) for m in np.unique(minutes))
            for minute, sub in groups:
                self._accumulate((node, gpu, minute), sub)
            self.samples_total += k
        return k

    def _accumulate(self, key: tuple[str, int, int], sub: npt.NDArray[np.float64]) -> None:
        acc = self._acc.get(key)
        if acc is None:
            acc = np.empty((4, NF))
            acc[0] = 0.0
            acc[1] = np.inf
            acc[2] = -np.inf
            acc[3] = 0.0
            self._acc[key] = acc
        present = ~np.isnan(sub)
        acc[0] += present.sum(axis=1)
        acc[1] = np.fmin(acc[1], np.fmin.reduce(sub, axis=1))
        acc[2] = np.fmax(acc[2], np.fmax.reduce(sub, axis=1))
        acc[3] += np.where(present, sub, 0.0).sum(axis=1)

    # -- reads ------------------------------------------------------------------------------
    def latest(self, node: str, gpu: int) -> tuple[float | None, dict[str, float | None]]:
        """The newest sample of one GPU (by timestamp) as ``(t, {field: value})``."""
        with self._lock:
            ring = self._rings.get((node, gpu))
            if ring is None or ring.n == 0:
                return None, {}
            vals = ring.last.tolist()
            t = ring.last_t
        return t, {f: (v if math.isfinite(v) else None) for f, v in zip(FIELDS, vals, strict=True)}

    def latest_field(self, node: str, gpus: int, name: str) -> list[float | None]:
        """One metric's newest value for GPUs 0..gpus-1 of a node (heatmap row)."""
        j = FIELD_INDEX[name]
        out: list[float | None] = []
        with self._lock:
            for i in range(gpus):
                ring = self._rings.get((node, i))
                v = float(ring.last[j]) if ring is not None else math.nan
                out.append(v if math.isfinite(v) else None)
        return out

    def series(
        self, node: str, gpu: int, names: Sequence[str], since_s: float | None = None
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Recent raw samples of one GPU, oldest first."""
        with self._lock:
            ring = self._rings.get((node, gpu))
            if ring is None or ring.n == 0:
                return [], {n: [] for n in names}
            k = min(ring.n, ring.cap)
            t = ring.t.copy() if k == ring.cap else ring.t[:k].copy()
            v = ring.v.copy() if k == ring.cap else ring.v[:k].copy()
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

    def forget_node(self, node: str) -> None:
        with self._lock:
            for key in [k for k in self._rings if k[0] == node]:
                del self._rings[key]

    # -- rollups ----------------------------------------------------------------------------
    def take_closed_minutes(
        self, now_s: float, lateness_s: float = 90.0, *, all_minutes: bool = False
    ) -> list[tuple[str, int, int, int, dict[str, list[float]]]]:
        """Remove and return accumulators of minutes that ended more than ``lateness_s`` ago:
        ``(node, gpu, minute_s, samples, {field: [count, min, mean, max]})``."""
        cutoff = now_s - lateness_s
        out = []
        with self._lock:
            keys = [k for k in self._acc if all_minutes or (k[2] + 1) * 60 <= cutoff]
            accs = [(k, self._acc.pop(k)) for k in keys]
        for (node, gpu, minute), acc in accs:
            stats: dict[str, list[float]] = {}
            n = 0
            for j, name in enumerate(FIELDS):
                c = int(acc[0, j])
                if c:
                    stats[name] = [c, float(acc[1, j]), float(acc[3, j] / c), float(acc[2, j])]
                    n = max(n, c)
            if stats:
                out.append((node, gpu, minute * 60, n, stats))
        return out


def merge_stats(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    """Combine two rollups of the same minute (a late batch after the first flush)."""
    out = dict(a)
    for name, (c2, mn2, mean2, mx2) in b.items():
        if name not in out:
            out[name] = [c2, mn2, mean2, mx2]
            continue
        c1, mn1, mean1, mx1 = out[name]
        c = c1 + c2
        out[name] = [c, min(mn1, mn2), (mean1 * c1 + mean2 * c2) / c, max(mx1, mx2)]
    return out
