"""The simulator's DVFS power model written out by hand from its cited formula (physics module
doc: P = idle + u*i*span*(s + (1-s)*g(f)/g(f0)), g(f) = f*V(f)^2, V flat at 0.7 below the knee
and linear to 1 at fmax, the knee placed where g(fmax)/g(f0) = (fmax/f0)^2) with the H200's
numbers typed from the catalog and fixture: idle 79 W, max 700 W, f0 = 1470 of 1980 MHz, the
power cap holding 0.987 x the limit. Independent of `gpufleet.devices.sim.physics`."""

from __future__ import annotations

import math

IDLE_W = 79.0
SPAN_W = 700.0 - IDLE_W
R0 = 1470 / 1980
V_MIN = 0.7
HOLD = 0.987
KNEE = ((1 - V_MIN) * R0 - (math.sqrt(R0) - V_MIN)) / (1 - math.sqrt(R0))


def g(r: float) -> float:
    v = V_MIN if r <= KNEE else V_MIN + (1 - V_MIN) * (r - KNEE) / (1 - KNEE)
    return r * v * v


def power(r: float, intensity: float, static: float) -> float:
    """Watts at clock ratio r, full utilisation, no cap."""
    return IDLE_W + intensity * SPAN_W * (static + (1 - static) * g(r) / (R0 * R0))


def capped_ratio(limit_w: float, intensity: float, static: float) -> float:
    """The clock ratio where the load's power equals the held power (bisection on g)."""
    if power(1.0, intensity, static) <= limit_w:
        return 1.0
    target = ((HOLD * limit_w - IDLE_W) / (intensity * SPAN_W) - static) / (1 - static) * R0 * R0
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if g(mid) < target else (lo, mid)
    return lo


def capped_power(limit_w: float, intensity: float, static: float) -> float:
    full = power(1.0, intensity, static)
    return full if full <= limit_w else HOLD * limit_w
