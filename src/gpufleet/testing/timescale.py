"""One scale factor for the tests' and rigs' times: ``GPUFLEET_TEST_TIME_SCALE`` (default 1).

Every condition wait's deadline (`gpufleet.testing.testbed.wait_for` and the suites' own
helpers) is ``scaled``: on a slow or loaded machine set the factor above 1 and the waits grow
with it. Protocol times a test sets (leases, grace periods, outages) go through ``scaled`` too
where the test judges them against the clock: the fencing suite's lease and margin, the process
chaos rounds' lease, push interval and end deadline, the HA chaos suite's lease, renewal and
failover bound. A slow machine then slows the protocol, not the verdict.
"""

from __future__ import annotations

import functools
import math
import os

from gpufleet.errors import UsageError

ENV = "GPUFLEET_TEST_TIME_SCALE"


@functools.cache
def time_scale() -> float:
    """The factor from ``GPUFLEET_TEST_TIME_SCALE``: a number from 0.1 to 100 (default 1)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{ENV}={raw!r}: not a number (a factor such as 2)") from None
    if not math.isfinite(value) or not 0.1 <= value <= 100:
        raise UsageError(f"{ENV}={raw!r}: must be from 0.1 to 100")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` times the factor."""
    return seconds * time_scale()
