"""Clocks for the simulator: real time, or a manual clock tests advance by hand."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class SimClock(Protocol):
    """Anything that tells the simulator what time it is, in seconds."""

    def __call__(self) -> float: ...


class ManualClock:
    """A clock that only moves when told to: deterministic physics in tests."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += seconds
            return self._now


def real_clock() -> float:
    """Wall-clock seconds (the simulator's default)."""
    return time.time()
