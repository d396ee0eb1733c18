"""Power, clock and temperature of a simulated GPU, calibrated on a real H200 trace.

Calibration (``tests/fixtures/nvidia-h200/load_trace.json``, driver 580.159.04):
- idle: 79 W, SM clock 345 MHz, 35 C GPU, 38 C memory, clock-event reason 0x1 (GPU idle);
- sustained bf16 matmul: power held at ~0.987 x the 700 W limit, reason 0x4 (SW power cap),
  SM clock ~1470 MHz instead of 1980, GPU 62 C reached within ~2.5 s, memory 51 C after ~25 s;
- after the load: clocks stay at max and power ~122 W for a while (the driver lingers), the GPU
  cools 62 -> 43 C within a second, then slowly towards idle.

Model: a load's power has a static part (HBM, L2, NVLink: does not follow the SM clock) and a
dynamic part that follows the DVFS law of CMOS switching power, P_dyn ~ C * V(f)^2 * f, with the
voltage flat below a knee and rising linearly with the clock above it (Mei, Wang and Chu, "A
survey and measurement study of GPU DVFS on energy conservation", Digital Communications and
Networks 3(2), 2017, section 2: P = P_static + P_dynamic, P_dynamic ~ V^2 f, and the voltage a
GPU needs rises with its core frequency):
P = idle + u * i * span * (s + (1 - s) * g(f) / g(f0)), g(f) = f * V(f)^2 (``dvfs_load_power``;
u utilization, i the workload's intensity relative to a bf16 matmul, s its static share, span max
power - idle, f0 the clock a bf16 matmul runs at under the default limit: 1470/1980 of the max
clock, as measured; ``gpufleet.catalog.performance.capped_clock_ratio``). When the demand at fmax
exceeds the limit, the clock falls until power equals the limit (reason SW power cap); a locked
clock (nvmlDeviceSetGpuLockedClocks) caps the clock below fmax, the power cap still applying.

Fitted to three operating points of the H200 fixture (load_trace.json): idle 79 W at 345 MHz
(``idle``), the bf16 burn's 691 W at 1470 MHz under the 700 W cap (``span`` and f0) and the
no-load 122.7 W at 1980 MHz right after a load (``linger``, the clocked-idle power). The shape of
V(f) is not in the fixture (NVML reports no voltage): V(f) / V(fmax) = 0.7 below the knee is an
assumption, and the knee (0.44 of fmax) is placed so that g(fmax) / g(f0) = (fmax / f0)^2, the
full-clock demand of the planner's quadratic model (``gpufleet.catalog.power``), which the model
therefore matches from f0 to fmax; below the knee power falls only linearly with the clock.
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
# DVFS voltage curve (module doc): V(f) / V(fmax), flat below the knee, linear above it
V_MIN_RATIO = 0.7  # modelling assumption: NVML reports no core voltage


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


def _knee_ratio() -> float:
    """The knee (clock / max clock) at which g(fmax) / g(f0) = (fmax / f0)^2 (module doc)."""
    r0 = perf.capped_clock_ratio()
    v0 = math.sqrt(r0)  # r0 * v0^2 = r0^2
    return ((1.0 - V_MIN_RATIO) * r0 - (v0 - V_MIN_RATIO)) / (1.0 - v0)


def voltage_ratio(clock_ratio: float) -> float:
    """V(f) / V(fmax) at f = ``clock_ratio`` x fmax: flat below the knee, linear above."""
    knee = _knee_ratio()
    r = max(0.0, min(1.0, clock_ratio))
    if r <= knee:
        return V_MIN_RATIO
    return V_MIN_RATIO + (1.0 - V_MIN_RATIO) * (r - knee) / (1.0 - knee)


def switching(clock_ratio: float) -> float:
    """g(f) = f * V(f)^2 relative to its value at fmax: the dynamic power's clock factor."""
    r = max(0.0, min(1.0, clock_ratio))
    return r * voltage_ratio(r) ** 2


def dvfs_load_power(
    p: PhysicsParams, clock_ratio: float, util: float, intensity: float, static: float = 0.0
) -> float:
    """Watts a load draws at a clock (the module doc's DVFS formula), no power cap applied."""
    r0 = perf.capped_clock_ratio()
    at_r0 = p.dyn_full_w * r0**2 * util * intensity  # the load's power above idle at f0
    return p.idle_w + at_r0 * (static + (1.0 - static) * switching(clock_ratio) / switching(r0))


def clocked_idle_power(p: PhysicsParams, clock_ratio: float) -> float:
    """Watts with no load but the clock held up (after a load, or locked): idle plus the
    clock-tree share of ``linger`` scaled by g(f) (the fixture's 122.7 W at 1980 MHz)."""
    r_idle = IDLE_SM_CLOCK_MHZ / p.max_sm_clock_mhz
    g = (switching(clock_ratio) - switching(r_idle)) / (1.0 - switching(r_idle))
    return p.idle_w + p.linger_w * max(0.0, g)


def _ratio_for(target: float) -> float:
    """The clock ratio where ``switching`` equals ``target`` (it is increasing): bisection."""
    lo, hi = 0.0, 1.0
    if target >= switching(1.0):
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if switching(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


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
    (``gpufleet.catalog.power`` profiles; 0 is the purely dynamic model); ``clock_cap_mhz``:
    a locked clock or a slowdown's ceiling."""
    fmax = p.max_sm_clock_mhz if clock_cap_mhz is None else min(p.max_sm_clock_mhz, clock_cap_mhz)
    r0 = perf.capped_clock_ratio()
    at_r0 = p.dyn_full_w * r0**2 * util * intensity  # the load's power above idle at f0
    if at_r0 <= 0:
        return fmax, p.idle_w, False
    full = dvfs_load_power(p, fmax / p.max_sm_clock_mhz, util, intensity, static)
    if full <= limit_w:
        return fmax, full, False
    held = limit_w * CAP_HOLD_RATIO
    x = ((held - p.idle_w) / at_r0 - static) / (1.0 - static)
    ratio = _ratio_for(max(x, 0.0) * switching(r0))
    clock = max(IDLE_SM_CLOCK_MHZ, min(fmax, p.max_sm_clock_mhz * ratio))
    return clock, held, True


def lag(value: float, target: float, dt: float, tau: float) -> float:
    """Exact first-order step towards a constant target."""
    return target + (value - target) * math.exp(-dt / tau)


def lag_integral(value: float, target: float, dt: float, tau: float) -> float:
    """Exact integral over ``dt`` of a first-order lag from ``value`` towards ``target``."""
    return target * dt + (value - target) * tau * (1.0 - math.exp(-dt / tau))
