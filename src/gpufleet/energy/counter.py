"""Energy between two readings of NVML's total energy counter, robust to what the counter does.

``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded (Volta and
later; NVML API reference, "Device Queries"). It is an unsigned 64-bit value, so a wrap is
taken as modular arithmetic; a reading below the previous one that is not near the top is a
reset (driver reload, GPU reset): the window's energy is then unknown from the counter and the
caller integrates power instead. A GPU without the counter reads None: same fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER_MAX = 2**64
WRAP_SLACK_MJ = 2**32  # a wrap only when the previous reading was within this of the top


@dataclass(frozen=True)
class EnergyReading:
    """Joules over a window and how they were obtained ("counter", "power" or None)."""

    joules: float | None
    method: str | None


def counter_delta_mj(before: int | None, after: int | None) -> int | None:
    """Millijoules between two counter readings; None when unknown (missing or reset)."""
    if before is None or after is None:
        return None
    if after >= before:
        return after - before
    if before > COUNTER_MAX - WRAP_SLACK_MJ:
        return after + COUNTER_MAX - before
    return None  # reset: the counter restarted from zero


def window_energy(
    before: int | None, after: int | None, power_integral_j: float | None
) -> EnergyReading:
    """The counter's energy for a window, else the integral of sampled power, else unknown."""
    delta = counter_delta_mj(before, after)
    if delta is not None:
        return EnergyReading(delta / 1000.0, "counter")
    if power_integral_j is not None:
        return EnergyReading(power_integral_j, "power")
    return EnergyReading(None, None)
