"""Power, clock and temperature of a simulated GPU, calibrated on a real H200 trace.

Calibration (``tests/fixtures/nvidia-h200/load_trace.json``, driver 580.159.04):
- idle: 79 W, SM clock 345 MHz, 35 C GPU, 38 C memory, clock-event reason 0x1 (GPU idle);
- sustained bf16 matmul: power held at ~0.987 x the 700 W limit, reason 0x4 (SW power cap),
  SM clock ~1470 MHz instead of 1980, GPU 62 C reached within ~2.5 s, memory 51 C after ~25 s;
- after the load: clocks stay at max and power ~122 W for a while (the driver lingers), the GPU
  cools 62 -> 43 C within a second, then slowly towards idle.

Model (shared with the power advisor: ``gpufleet.catalog.power``): a load's power has a static
part (HBM, L2, NVLink: does not follow the SM clock) and a dynamic part growing with the square
of the SM clock, P = idle + u * i * span * (s + (1 - s) * (f / f0)^2) (u utilization, i the
workload's intensity relative to a bf16 matmul, s its static share, span max power - idle, f0
the clock a bf16 matmul runs at under the default limit: 1470/1980 of the max clock, as measured;
``gpufleet.catalog.performance.capped_clock_ratio``). When the demand at fmax exceeds the limit,
the clock falls until power equals the limit (reason SW power cap).
Power follows a first-order lag (tau 0.25 s); GPU temperature two lags (75 % fast, tau 0.7 s;
25 % slow, tau 5 s) towards 35 C + R (P - idle); memory temperature one lag (tau 10 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.catalog import performance as perf

CAP_HOLD_RATIO = 0.987  # measured: 691 W average under the 700 W cap
IDLE_SM_CLOCK_MHZ = 345
LINGER_S = 15.0  # clocks stay up after a load ends (trace: >12 s at 1980 MHz, ~122 W)
LINGER_POWER_FRACTION = 43.0 / 700.0  # trace: 122 W - 79 W idle on a 700 W part
TAU_POWER_S = 0.25
TAU_TEMP_FAST_S = 0.7
TAU_TEMP_SLOW_S = 5.0
TEMP_FAST_FRACTION = 0.75
TAU_MEM_TEMP_S = 10.0
IDLE_TEMP_C = 35.0
IDLE_MEM_TEMP_C = 38.0
BURN_TEMP_RISE_C = 27.0  # 35 -> 62 C at the 700 W cap
BURN_MEM_TEMP_RISE_C = 13.0  # 38 -> 51 C


@dataclass
class PhysicsParams:
    """Per-GPU constants derived from the catalog model."""

    idle_w: float
    max_sm_clock_mhz: float
    dyn_full_w: float  # power above idle of a bf16 matmul at full util and max clock (s = 0)
    r_c_per_w: float  # GPU temperature rise per watt above idle
    r_mem_c_per_w: float
    linger_w: float

    @classmethod
    def for_model(
        cls, max_power_w: float, idle_w: float | None, max_sm_clock_mhz: int | None
    ) -> PhysicsParams:
        idle = idle_w if idle_w is not None else 0.113 * max_power_w  # H200: 79/700
        span = max_power_w - idle
        return cls(
            idle_w=idle,
            max_sm_clock_mhz=float(max_sm_clock_mhz or 1980),
            dyn_full_w=span / perf.capped_clock_ratio() ** 2,
            r_c_per_w=BURN_TEMP_RISE_C / span,
            r_mem_c_per_w=BURN_MEM_TEMP_RISE_C / span,
            linger_w=LINGER_POWER_FRACTION * max_power_w,
        )


@dataclass
class PhysicsState:
    """The evolving state: lagged power and temperatures, the energy counter."""

    power_w: float
    temp_fast_c: float
    temp_slow_c: float
    mem_temp_c: float
    energy_mj: float
    sm_clock_mhz: float
    reasons: int


def steady_clock_and_power(
    p: PhysicsParams,
    limit_w: float,
    util: float,
    intensity: float,
    clock_cap_mhz: float | None,
    static: float = 0.0,
) -> tuple[float, float, bool]:
    """Clock and power the GPU settles at for a load; True when the power cap holds it.

    ``static``: the share of the load's power at f0 that does not follow the SM clock
    (``gpufleet.catalog.power`` profiles; 0 is the purely dynamic model)."""
    fmax = p.max_sm_clock_mhz if clock_cap_mhz is None else min(p.max_sm_clock_mhz, clock_cap_mhz)
    r0 = perf.capped_clock_ratio()
    at_r0 = p.dyn_full_w * r0**2 * util * intensity  # the load's power above idle at f0
    if at_r0 <= 0:
        return fmax, p.idle_w, False
    full = p.idle_w + at_r0 * (static + (1.0 - static) * (fmax / p.max_sm_clock_mhz / r0) ** 2)
    if full <= limit_w:
        return fmax, full, False
    held = limit_w * CAP_HOLD_RATIO
    x = ((held - p.idle_w) / at_r0 - static) / (1.0 - static)
    ratio = r0 * math.sqrt(max(x, 0.0))
    clock = max(IDLE_SM_CLOCK_MHZ, min(fmax, p.max_sm_clock_mhz * ratio))
    return clock, held, True


def lag(value: float, target: float, dt: float, tau: float) -> float:
    """Exact first-order step towards a constant target."""
    return target + (value - target) * math.exp(-dt / tau)


def lag_integral(value: float, target: float, dt: float, tau: float) -> float:
    """Exact integral over ``dt`` of a first-order lag from ``value`` towards ``target``."""
    return target * dt + (value - target) * tau * (1.0 - math.exp(-dt / tau))
