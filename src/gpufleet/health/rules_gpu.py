"""Per-GPU rules about links, clocks, temperature and configuration, and the lost-GPU rule.

Sources: NVML API Reference (docs.nvidia.com/deploy/nvml-api/) for clock-event reasons and
PCIe link queries; the PCIe replay thresholds (1.92 replays per minute per lane at Gen5, 0.96 at
Gen4) and the 5 C margin to the slowdown temperature are the figures of issue 3.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from pydantic import Field

from gpufleet.catalog import XidAction
from gpufleet.devices.types import ClockEventReason as R
from gpufleet.devices.types import decode_clock_reasons
from gpufleet.health.context import GpuContext
from gpufleet.health.registry import RuleParams, gpu_finding, register_rule
from gpufleet.health.types import Finding, Severity


def _busy(ctx: GpuContext, min_util_pct: float) -> bool:
    util = ctx.window.latest("gpu_util_pct")
    return util is not None and util >= min_util_pct


class PcieLinkParams(RuleParams):
    """An idle GPU trains its link down to save power, so a generation below max counts only
    while the GPU is at least ``busy_util_pct`` busy; a narrow link counts always."""

    busy_util_pct: float = Field(10.0, ge=0, le=100)


@register_rule(
    "pcie_link",
    scope="gpu",
    params=PcieLinkParams,
    description="PCIe link below its max generation (while busy) or width",
)
def pcie_link(ctx: GpuContext, p: PcieLinkParams) -> Iterable[Finding]:
    info = ctx.info
    if info is None:
        return
    gen, gen_max = info.pcie_gen_current, info.pcie_gen_max
    width, width_max = info.pcie_width_current, info.pcie_width_max
    ev = {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max}
    if width is not None and width_max is not None and width < width_max:
        yield gpu_finding(
            ctx,
            "pcie_link",
            "PCIE_WIDTH_DOWNGRADED",
            Severity.WARN,
            f"PCIe link x{width} below its x{width_max}: reseat or inspect the riser/cable",
            action=XidAction.DRAIN_AND_INSPECT,
            evidence=ev,
        )
    if gen is not None and gen_max is not None and gen < gen_max and _busy(ctx, p.busy_util_pct):
        yield gpu_finding(
            ctx,
            "pcie_link",
            "PCIE_GEN_DOWNGRADED",
            Severity.WARN,
            f"PCIe link at Gen{gen} below its Gen{gen_max} while busy",
            action=XidAction.RESET_GPU,
            evidence={**ev, "gpu_util_pct": ctx.window.latest("gpu_util_pct")},
        )


class PcieReplayParams(RuleParams):
    """Replays per minute per lane by link generation (issue 3: Gen5 1.92, Gen4 0.96); a
    generation not listed uses the nearest listed one. The threshold is per lane times width."""

    per_lane_per_min: dict[int, float] = Field(default_factory=lambda: {4: 0.96, 5: 1.92})
    min_span_s: float = Field(2.0, gt=0)
    min_increase: int = Field(2, ge=1)

    def threshold_per_min(self, gen: int, width: int) -> float:
        table = self.per_lane_per_min
        nearest = min(table, key=lambda g: (abs(g - gen), -g))
        return table[nearest] * width


@register_rule(
    "pcie_replay_rate",
    scope="gpu",
    params=PcieReplayParams,
    description="PCIe replay counter climbing faster than the per-lane threshold",
)
def pcie_replay_rate(ctx: GpuContext, p: PcieReplayParams) -> Iterable[Finding]:
    inc = ctx.window.counter_rise("pcie_replay_count", p.min_span_s, p.min_increase)
    if inc is None or ctx.info is None:
        return
    increase, span = inc
    gen = ctx.info.pcie_gen_current or ctx.info.pcie_gen_max
    width = ctx.info.pcie_width_current or ctx.info.pcie_width_max
    if gen is None or width is None:
        return
    rate = increase / span * 60.0
    limit = p.threshold_per_min(gen, width)
    if rate > limit:
        yield gpu_finding(
            ctx,
            "pcie_replay_rate",
            "PCIE_REPLAY_RATE",
            Severity.WARN,
            f"{rate:.1f} PCIe replays/min above {limit:.2f} (Gen{gen} x{width})",
            action=XidAction.DRAIN_AND_INSPECT,
            evidence={
                "replays": increase,
                "window_s": round(span, 3),
                "per_min": round(rate, 2),
                "threshold_per_min": round(limit, 3),
                "gen": gen,
                "width": width,
            },
        )


_HW_REASONS = {
    R.HW_THERMAL_SLOWDOWN: ("HW_THERMAL_SLOWDOWN", "HW thermal slowdown: check cooling/airflow"),
    R.HW_POWER_BRAKE_SLOWDOWN: (
        "HW_POWER_BRAKE",
        "HW power brake asserted: check the PSUs and the power-brake signal",
    ),
}


@register_rule(
    "hw_slowdown",
    scope="gpu",
    description="HW thermal slowdown or HW power brake active (clock-event reasons)",
)
def hw_slowdown(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    mask = ctx.window.latest("clock_event_reasons")
    if mask is None:
        return
    for bit, (code, text) in _HW_REASONS.items():
        if mask & bit:
            yield gpu_finding(
                ctx,
                "hw_slowdown",
                code,
                Severity.WARN,
                text,
                action=XidAction.DRAIN_AND_INSPECT,
                evidence={
                    "clock_event_reasons": hex(int(mask)),
                    "reasons": decode_clock_reasons(int(mask)),
                    "sm_clock_mhz": ctx.window.latest("sm_clock_mhz"),
                },
            )


class TempParams(RuleParams):
    """Warn when the GPU is within ``margin_c`` of its slowdown temperature (issue 3: 5 C)."""

    margin_c: float = Field(5.0, ge=0)


@register_rule(
    "temp_near_slowdown",
    scope="gpu",
    params=TempParams,
    description="GPU temperature within a margin of its slowdown limit",
)
def temp_near_slowdown(ctx: GpuContext, p: TempParams) -> Iterable[Finding]:
    temp = ctx.window.latest("gpu_temp_c")
    limit = ctx.info.slowdown_temp_c if ctx.info else None
    if temp is None or limit is None:
        return
    if temp >= limit - p.margin_c:
        yield gpu_finding(
            ctx,
            "temp_near_slowdown",
            "TEMP_NEAR_SLOWDOWN",
            Severity.WARN,
            f"{temp:.0f} C, within {p.margin_c:g} C of the {limit} C slowdown limit",
            evidence={"gpu_temp_c": temp, "slowdown_temp_c": limit, "margin_c": p.margin_c},
        )


class ClockLowParams(RuleParams):
    """Under load (``gpu_util >= busy_util_pct``) the SM clock should not sit below
    ``low_fraction`` of its max for longer than ``hold_s`` unless the power cap holds it."""

    busy_util_pct: float = Field(80.0, ge=0, le=100)
    low_fraction: float = Field(0.6, gt=0, le=1)
    hold_s: float = Field(30.0, ge=0)


@register_rule(
    "clock_held_low",
    scope="gpu",
    params=ClockLowParams,
    description="SM clock held low under load for longer than N s without a power-cap reason",
)
def clock_held_low(ctx: GpuContext, p: ClockLowParams) -> Iterable[Finding]:
    max_clock = ctx.info.max_sm_clock_mhz if ctx.info else None
    if not max_clock:
        return
    limit = p.low_fraction * max_clock
    run_start: float | None = None
    run_end: float | None = None
    lowest: int | None = None
    for s in reversed(ctx.window.samples):  # the newest run of low-clock samples
        if s.sm_clock_mhz is None or s.gpu_util_pct is None:
            continue
        reasons = s.clock_event_reasons or 0
        low = (
            s.gpu_util_pct >= p.busy_util_pct
            and s.sm_clock_mhz < limit
            and not reasons & R.SW_POWER_CAP
        )
        if not low:
            break
        run_end = run_end if run_end is not None else s.timestamp_s
        run_start = s.timestamp_s
        lowest = s.sm_clock_mhz if lowest is None else min(lowest, s.sm_clock_mhz)
    if run_start is None or run_end is None:
        return
    held = run_end - run_start
    if held >= p.hold_s:
        yield gpu_finding(
            ctx,
            "clock_held_low",
            "CLOCK_HELD_LOW",
            Severity.WARN,
            f"SM clock {lowest} MHz under load for {held:.0f} s "
            f"(< {p.low_fraction:.0%} of {max_clock} MHz, no power cap)",
            evidence={
                "sm_clock_mhz": lowest,
                "max_sm_clock_mhz": max_clock,
                "held_s": round(held, 3),
                "hold_s": p.hold_s,
                "reasons": decode_clock_reasons(ctx.window.latest("clock_event_reasons")),
            },
        )


@register_rule("gpu_lost", scope="gpu", description="the GPU fell off the bus (GPU_IS_LOST)")
def gpu_lost(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    lost_events = [e for e in ctx.events if e.kind == "gpu_lost"]
    if ctx.lost or lost_events:
        yield gpu_finding(
            ctx,
            "gpu_lost",
            "GPU_LOST",
            Severity.FAIL,
            "fell off the bus (NVML: GPU is lost); reboot the node",
            action=XidAction.REBOOT_NODE,
            evidence={
                "lost": True,
                "since_s": min((e.timestamp_s for e in lost_events), default=None),
            },
            sticky=True,
        )


@register_rule(
    "gpu_unresponsive", scope="gpu", description="the GPU did not answer NVML within the deadline"
)
def gpu_unresponsive(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    timeouts = [e for e in ctx.events if e.kind == "nvml_timeout"]
    if timeouts:
        finding = gpu_finding(
            ctx,
            "gpu_unresponsive",
            "GPU_NVML_TIMEOUT",
            Severity.FAIL,
            "did not answer NVML",
            action=XidAction.RESET_GPU,
            evidence={"nvml_timeout": True, "detail": timeouts[-1].detail},
        )
        # The device layer's own words: "GPU 7 did not answer NVML within 5 s".
        yield replace(finding, message=timeouts[-1].detail or finding.message)


@register_rule("persistence_mode", scope="gpu", description="persistence mode is off")
def persistence_mode(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    if ctx.info is not None and ctx.info.persistence_mode is False:
        yield gpu_finding(
            ctx,
            "persistence_mode",
            "PERSISTENCE_MODE_OFF",
            Severity.WARN,
            "persistence mode is off (enable nvidia-persistenced)",
            evidence={"persistence_mode": False},
        )


@register_rule("ecc_disabled", scope="gpu", description="ECC is disabled")
def ecc_disabled(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    if ctx.info is not None and ctx.info.ecc_current is False:
        pending = ctx.info.ecc_pending is True
        yield gpu_finding(
            ctx,
            "ecc_disabled",
            "ECC_DISABLED",
            Severity.WARN,
            "ECC is disabled"
            + ("; enabled on next reset" if pending else " (nvidia-smi -e 1, then reset)"),
            action=XidAction.RESET_GPU if pending else XidAction.NONE,
            evidence={"ecc_current": False, "ecc_pending": ctx.info.ecc_pending},
        )
