"""Turn raw figures into TestResults: the one place both engines judge what they measured."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.catalog import GpuModel
from gpufleet.devices.types import ClockEventReason as R
from gpufleet.devices.types import decode_clock_reasons
from gpufleet.validate import thresholds as th
from gpufleet.validate.collectives import peak_busbw
from gpufleet.validate.nvlink import nvlink_pairs as nvlink_pairs  # judged there
from gpufleet.validate.results import CollectiveRow, Metric, Status, TestResult, TracePoint, worst

HW_REASONS = R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN
WARN_REASONS = R.SW_THERMAL_SLOWDOWN


@dataclass(frozen=True)
class Target:
    """One GPU under test."""

    node: str
    gpu: int
    model: GpuModel | None


def _result(test: str, t: Target, metrics: list[Metric], msg: str, **details: object) -> TestResult:
    status = worst([m.status for m in metrics])
    return TestResult(test, t.node, status, msg, gpu=t.gpu, metrics=metrics, details=dict(details))


def _fails(metrics: list[Metric]) -> str:
    bad = [m for m in metrics if m.status is not Status.PASS]
    return "; ".join(
        f"{m.name} {m.value:.1f} {m.unit} < {m.pass_min or 0:.1f} (expected {m.expected or 0:.1f})"
        for m in bad
    )


def pcie(
    t: Target, h2d: float, d2h: float, gen: int | None, width: int | None, thr: th.Thresholds
) -> TestResult:
    m = t.model
    metrics = [
        thr.judge(
            "pcie_bandwidth", "h2d", h2d, th.expected_pcie_gbps(m, "h2d") if m else None, "GB/s"
        ),
        thr.judge(
            "pcie_bandwidth", "d2h", d2h, th.expected_pcie_gbps(m, "d2h") if m else None, "GB/s"
        ),
    ]
    msg = f"H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s over Gen{gen} x{width}"
    bad = _fails(metrics)
    return _result(
        "pcie_bandwidth", t, metrics, f"{msg}; {bad}" if bad else msg, gen=gen, width=width
    )


def hbm(t: Target, gbps: float, thr: th.Thresholds) -> TestResult:
    exp = th.expected_hbm_gbps(t.model) if t.model else None
    metrics = [thr.judge("hbm_bandwidth", "copy", gbps, exp, "GB/s")]
    bad = _fails(metrics)
    return _result("hbm_bandwidth", t, metrics, bad or f"copy {gbps:.0f} GB/s (read + write)")


def memory(
    t: Target, tested_bytes: int, free_bytes: int, addresses: list[int], patterns: list[str]
) -> TestResult:
    frac = tested_bytes / free_bytes if free_bytes else 0.0
    metrics = [
        Metric(
            "errors",
            float(len(addresses)),
            "count",
            0.0,
            None,
            Status.FAIL if addresses else Status.PASS,
        )
    ]
    if addresses:
        shown = ", ".join(f"0x{a:x}" for a in addresses[:8])
        msg = f"{len(addresses)} memory error(s) at {shown}" + (
            " ..." if len(addresses) > 8 else ""
        )
    elif frac < 0.90:
        metrics[0].status = Status.WARN
        msg = f"only {frac:.0%} of free memory could be tested"
    else:
        msg = f"{tested_bytes / 2**30:.1f} GiB ({frac:.0%} of free) verified, patterns {patterns}"
    return _result(
        "memory",
        t,
        metrics,
        msg,
        tested_bytes=tested_bytes,
        free_bytes=free_bytes,
        addresses=[f"0x{a:x}" for a in addresses],
        patterns=patterns,
    )


def matmul(
    t: Target, figures: dict[str, tuple[float, bool, float]], skipped: list[str], thr: th.Thresholds
) -> TestResult:
    """``figures``: dtype -> (TFLOP/s, correct, max relative error)."""
    metrics: list[Metric] = []
    wrong: list[str] = []
    for dtype, (tflops, ok, err) in figures.items():
        exp = th.expected_matmul_tflops(t.model, dtype) if t.model else None
        m = thr.judge("matmul", dtype, tflops, exp, "TFLOP/s")
        if not ok:
            m.status = Status.FAIL
            wrong.append(f"{dtype} result wrong (max rel. error {err:.2e})")
        metrics.append(m)
    parts = wrong + ([_fails(metrics)] if _fails(metrics) and not wrong else [])
    msg = (
        "; ".join(p for p in parts if p)
        or ", ".join(f"{d} {v[0]:.0f}" for d, v in figures.items()) + " TFLOP/s, results correct"
    )
    return _result(
        "matmul",
        t,
        metrics,
        msg,
        skipped=skipped,
        max_rel_error={d: v[2] for d, v in figures.items()},
    )


def stress(
    t: Target,
    burst: float,
    sustained: float,
    trace: list[TracePoint],
    limit_w: float | None,
    thr: th.Thresholds,
) -> TestResult:
    """Burst vs sustained bf16 TFLOP/s, every clock-event reason seen, HW slowdowns fail."""
    exp = th.expected_sustained_tflops(t.model) if t.model else None
    metrics = [
        thr.judge("stress", "sustained_bf16", sustained, exp, "TFLOP/s"),
        Metric("burst_bf16", burst, "TFLOP/s"),
    ]
    seen = 0
    for p in trace:
        seen |= int(p.reasons or 0)
    seen &= ~int(R.GPU_IDLE)
    half = trace[len(trace) // 2 :] or trace
    clocks = [p.sm_clock_mhz for p in half if p.sm_clock_mhz is not None]
    powers = [p.power_w for p in half if p.power_w is not None]
    temps = [p.temp_c for p in trace if p.temp_c is not None]
    clock = sum(clocks) / len(clocks) if clocks else 0.0
    power = sum(powers) / len(powers) if powers else 0.0
    words = decode_clock_reasons(seen) or ["no clock-event reason"]
    where = (
        f"at the {limit_w:.0f} W power cap"
        if seen & R.SW_POWER_CAP and limit_w
        else f"at {power:.0f} W"
    )
    pct = 100.0 * sustained / burst if burst else 0.0
    msg = (
        f"sustained {sustained:.0f} TFLOP/s {where}, SM clock {clock:.0f} MHz, "
        f"{pct:.0f} % of burst; reasons seen: {', '.join(words)}"
    )
    if seen & HW_REASONS:
        metrics[0].status = Status.FAIL
        msg = (
            "HW slowdown seen (" + ", ".join(decode_clock_reasons(seen & HW_REASONS)) + "); " + msg
        )
    elif seen & WARN_REASONS and metrics[0].status is Status.PASS:
        metrics[0].status = Status.WARN
    metrics += [Metric("sm_clock", clock, "MHz"), Metric("power", power, "W")]
    return _result(
        "stress",
        t,
        metrics,
        msg,
        reasons_seen=words,
        reasons_mask=seen,
        max_temp_c=max(temps) if temps else None,
        burst_pct=pct,
    )


def targeted_power(
    t: Target, power_w: float, limit_w: float | None, thr: th.Thresholds
) -> TestResult:
    frac = thr.limits("targeted_power").min_power_fraction
    need = frac * limit_w if limit_w else None
    st = Status.PASS if need is None or power_w >= need else Status.FAIL
    metric = Metric("power", power_w, "W", limit_w, need, st)
    msg = (
        f"reached {power_w:.0f} W of the {limit_w:.0f} W limit ({power_w / limit_w:.1%})"
        if limit_w
        else f"reached {power_w:.0f} W (limit unknown)"
    )
    if st is Status.FAIL:
        msg += f"; needs >= {need:.0f} W"
    return _result("targeted_power", t, [metric], msg, limit_w=limit_w)


def collectives(
    node: str,
    test: str,
    rows: list[CollectiveRow],
    n_ranks: int,
    expected_busbw: Mapping[str, float] | float | None,
    thr: th.Thresholds,
) -> TestResult:
    """Judge every op's large-message plateau against its own expected busbw
    (``expected_busbw``: op -> GB/s; a single figure judges all_reduce only)."""
    expected = (
        dict(expected_busbw)
        if isinstance(expected_busbw, Mapping)
        else {"all_reduce": expected_busbw}
        if expected_busbw
        else {}
    )
    ops = sorted({r.op for r in rows})
    metrics = []
    for op in ops:
        value = peak_busbw(rows, op)
        exp = expected.get(op)
        if exp:
            metrics.append(thr.judge(test, f"{op}_busbw", value, exp, "GB/s"))
        else:
            metrics.append(Metric(f"{op}_busbw", value, "GB/s"))
    ar = peak_busbw(rows, "all_reduce")
    msg = f"{n_ranks} ranks, all_reduce busbw {ar:.1f} GB/s"
    if expected.get("all_reduce"):
        msg += f" (expected {expected['all_reduce']:.1f})"
    bad = [m for m in metrics if m.status is Status.FAIL]
    if bad:
        msg += "; below the pass line: " + ", ".join(
            f"{m.name} {m.value:.1f} < {m.pass_min or 0:.1f} GB/s" for m in bad
        )
    status = worst([m.status for m in metrics])
    return TestResult(
        test,
        node,
        status,
        msg,
        metrics=metrics,
        details={"ranks": n_ranks, "expected_busbw": {k: round(v, 3) for k, v in expected.items()}},
    )
