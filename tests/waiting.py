"""Polling waits for the tests, their limits times the tests' time scale
(`gpufleet.testing.timescale`: a loaded machine slows the wait, not the verdict)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpufleet.testing.timescale import scaled

T = TypeVar("T")


def wait_until(pred: Callable[[], bool], timeout: float, step_s: float = 0.05) -> bool:
    """Poll ``pred`` every ``step_s`` for up to ``timeout`` seconds; whether it came true
    (asked once more at the end)."""
    end = time.monotonic() + scaled(timeout)
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def wait_truthy(cond: Callable[[], T], limit_s: float, what: str, step_s: float = 0.1) -> T:
    """``cond()``'s first truthy answer, polled every ``step_s``; the test fails (an
    AssertionError naming ``what``) when none came within ``limit_s`` seconds."""
    deadline = time.monotonic() + scaled(limit_s)
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {limit_s} s waiting for {what}"
        time.sleep(step_s)
