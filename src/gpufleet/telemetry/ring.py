"""`RingBuffer`: a fixed-size numeric history of one GPU (one float64 column per field)."""

from __future__ import annotations

import math

import numpy as np

_INDEXES: dict[tuple[str, ...], dict[str, int]] = {}


def _index_of(columns: tuple[str, ...]) -> dict[str, int]:
    """Column name -> position, one shared (read-only) mapping per column tuple: thousands of
    rings of the same tier hold one dict, not one each."""
    index = _INDEXES.get(columns)
    if index is None:
        index = _INDEXES.setdefault(columns, {name: i for i, name in enumerate(columns)})
    return index


class RingBuffer:
    """The last ``capacity`` rows of ``columns``, with their timestamps; NaN marks "no value".

    Storage is two preallocated numpy arrays; appending overwrites the oldest row. ``count`` is
    the total number of rows ever appended, so a reader can ask for what came ``since`` a count
    it saw before (the pusher does).
    """

    def __init__(self, columns: tuple[str, ...], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("ring buffer capacity must be at least 1")
        self.columns = columns
        self.index = _index_of(columns)
        self.capacity = capacity
        self._t = np.full(capacity, math.nan, dtype=np.float64)
        self._data = np.full((capacity, len(columns)), math.nan, dtype=np.float64)
        self.count = 0

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    @property
    def nbytes(self) -> int:
        return int(self._t.nbytes + self._data.nbytes)

    def append(self, t: float, row: np.ndarray) -> None:
        pos = self.count % self.capacity
        self._t[pos] = t
        self._data[pos, :] = row
        self.count += 1

    def latest(self) -> tuple[float, np.ndarray] | None:
        """The newest row (a view: copy it to keep it), or None when empty."""
        if self.count == 0:
            return None
        pos = (self.count - 1) % self.capacity
        return float(self._t[pos]), self._data[pos]

    def latest_value(self, name: str) -> float:
        """The newest value of one column (NaN when empty or unsupported)."""
        if self.count == 0:
            return math.nan
        return float(self._data[(self.count - 1) % self.capacity, self.index[name]])

    def last(self, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` newest rows, oldest first: (timestamps, rows). Copies."""
        size = len(self)
        n = size if n is None else max(0, min(n, size))
        if n == 0:
            return np.empty(0), np.empty((0, len(self.columns)))
        end = self.count % self.capacity
        idx = (np.arange(end - n, end) % self.capacity).astype(np.intp)
        return self._t[idx].copy(), self._data[idx].copy()

    def since(self, count: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Rows appended after the reader's ``count`` (those still held), and the new count."""
        missing = max(0, self.count - count)
        t, rows = self.last(missing)
        return t, rows, self.count

    def column(self, name: str, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps, values) of one column over the newest ``n`` rows."""
        t, rows = self.last(n)
        return t, rows[:, self.index[name]]
