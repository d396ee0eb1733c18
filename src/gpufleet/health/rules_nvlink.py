"""NVLink health: error counters and link state, per link where NVML reports links.

Thresholds follow DCGM's NVLink health watch (NVIDIA DCGM source, ``DcgmHealthWatch::
MonitorLwLinkErrorCounts`` and ``dcgm_gpu_hardware_limits.h``): any CRC error in the window is a
warning and 100 or more per second a failure ("RM has informed us that CRC errors only matter at
rates of 100+ per second", ``DCGM_LIMIT_MAX_LWLINK_CRC_ERROR 100.0``); any recovery error is a
failure; a link that is down is a failure. DCGM also fails on replay errors; here a replay (a
flit resent after a CRC error, corrected by the link) warns, like the CRC errors that cause it.

Input: ``Sample.nvlink_links`` (per-link counters and state, NVML field values scoped by link)
when the window has them, else the per-GPU totals (``nvlink_crc_flit_errors``,
``nvlink_crc_errors``, ``nvlink_replay_errors``, ``nvlink_recovery_errors``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field

from gpufleet.catalog import XidAction
from gpufleet.devices.types import NvLinkCounters, Sample
from gpufleet.health.context import GpuContext
from gpufleet.health.registry import RuleParams, gpu_finding, register_rule
from gpufleet.health.types import Finding, Severity

# DCGM dcgm_gpu_hardware_limits.h: DCGM_LIMIT_MAX_LWLINK_CRC_ERROR (per second)
CRC_FAIL_PER_S = 100.0
# DCGM dcgm_gpu_hardware_limits.h: DCGM_LIMIT_MAX_LWLINK_ERROR (errors in the window)
ERROR_LIMIT = 1


class NvLinkParams(RuleParams):
    """CRC errors per second at which a warning becomes a failure; the least increase of any
    counter that counts; whether an inactive link fails (HGX boards wire every link)."""

    crc_fail_per_s: float = Field(CRC_FAIL_PER_S, gt=0)
    min_increase: int = Field(ERROR_LIMIT, ge=1)
    link_down_fails: bool = True


def _increase(points: list[tuple[float, int | None]]) -> tuple[int, float] | None:
    """(increase, span_s) of a cumulative counter; a reset counts from its new value."""
    pts = [(t, v) for t, v in points if v is not None]
    if len(pts) < 2:
        return None
    inc = 0
    for (_, a), (_, b) in itertools.pairwise(pts):
        assert a is not None and b is not None
        inc += b - a if b >= a else b
    return inc, pts[-1][0] - pts[0][0]


def _links(samples: tuple[Sample, ...]) -> dict[int, list[tuple[float, NvLinkCounters]]]:
    out: dict[int, list[tuple[float, NvLinkCounters]]] = {}
    for s in samples:
        for link in s.nvlink_links or ():
            out.setdefault(link.link, []).append((s.timestamp_s, link))
    return out


@register_rule(
    "nvlink",
    scope="gpu",
    params=NvLinkParams,
    description="NVLink CRC/replay errors (warn), recovery errors or a link down (fail)",
)
def nvlink(ctx: GpuContext, p: NvLinkParams) -> Iterable[Finding]:
    links = _links(ctx.window.samples)
    if links:
        yield from _per_link(ctx, p, links)
        return
    # Totals only (no per-link readings, e.g. an agent's ring-buffer window).
    series = {
        name: [(s.timestamp_s, getattr(s, name)) for s in ctx.window.samples]
        for name in (
            "nvlink_crc_flit_errors",
            "nvlink_crc_errors",
            "nvlink_replay_errors",
            "nvlink_recovery_errors",
        )
    }
    incs = {name: _increase(pts) for name, pts in series.items()}
    crc = [v for k, v in incs.items() if "crc" in k and v is not None]
    crc_inc = sum(v[0] for v in crc)
    span = max((v[1] for v in crc), default=0.0)
    yield from _judge(
        ctx, p, None, crc_inc, span, incs["nvlink_replay_errors"], incs["nvlink_recovery_errors"]
    )


def _per_link(
    ctx: GpuContext, p: NvLinkParams, links: dict[int, list[tuple[float, NvLinkCounters]]]
) -> Iterable[Finding]:
    latest = {n: pts[-1][1] for n, pts in links.items()}
    any_active = any(c.active for c in latest.values())
    for n in sorted(links):
        pts = links[n]
        if p.link_down_fails and any_active and latest[n].active is False:
            yield gpu_finding(
                ctx,
                "nvlink",
                "NVLINK_DOWN",
                Severity.FAIL,
                f"NVLink {n} is down while its other links are up",
                action=XidAction.DRAIN_AND_INSPECT,
                evidence={"link": n, "active": False},
                sticky=True,
                occurrence=f"link{n}",
            )
        crc = _increase([(t, c.crc_errors) for t, c in pts])
        yield from _judge(
            ctx,
            p,
            n,
            crc[0] if crc else 0,
            crc[1] if crc else 0.0,
            _increase([(t, c.replay_errors) for t, c in pts]),
            _increase([(t, c.recovery_errors) for t, c in pts]),
        )


def _judge(
    ctx: GpuContext,
    p: NvLinkParams,
    link: int | None,
    crc_inc: int,
    span: float,
    replay: tuple[int, float] | None,
    recovery: tuple[int, float] | None,
) -> Iterable[Finding]:
    yield from _counted(ctx, p, link, recovery, _RECOVERY)
    if crc_inc >= p.min_increase and span > 0:
        rate = crc_inc / span
        fail = rate >= p.crc_fail_per_s
        yield gpu_finding(
            ctx,
            "nvlink",
            "NVLINK_CRC_ERRORS",
            Severity.FAIL if fail else Severity.WARN,
            f"{_where(link)}: {crc_inc} CRC error(s) in {span:.0f} s ({rate:.1f}/s; fail at "
            f"{p.crc_fail_per_s:g}/s)",
            action=XidAction.DRAIN_AND_INSPECT,
            evidence={
                "link": link,
                "crc_errors": crc_inc,
                "per_s": round(rate, 3),
                "window_s": span,
            },
        )
    yield from _counted(ctx, p, link, replay, _REPLAY)


def _where(link: int | None) -> str:
    """``NVLink 3``; ``NVLink`` for the GPU's totals."""
    return f"NVLink {link}" if link is not None else "NVLink"


@dataclass(frozen=True)
class _Counter:
    """An NVLink error counter judged by its increase alone: the finding it raises."""

    code: str
    severity: Severity
    evidence_key: str
    what: str  # the errors counted, after the count in the message
    after: str = ""  # the end of the message
    sticky: bool = False  # a sticky finding is one occurrence per link and count


_RECOVERY = _Counter(
    "NVLINK_RECOVERY_ERRORS",
    Severity.FAIL,
    "recovery_errors",
    "recovery error(s)",
    after=" (link retrained)",
    sticky=True,
)
_REPLAY = _Counter("NVLINK_REPLAY_ERRORS", Severity.WARN, "replay_errors", "replay(s)")


def _counted(
    ctx: GpuContext,
    p: NvLinkParams,
    link: int | None,
    counted: tuple[int, float] | None,
    counter: _Counter,
) -> Iterable[Finding]:
    """``counter``'s finding when it rose by ``p.min_increase`` or more; ``counted`` is the
    (increase, span in s) on ``link`` (None: the GPU's totals)."""
    if counted is None or counted[0] < p.min_increase:
        return
    increase, span = counted
    yield gpu_finding(
        ctx,
        "nvlink",
        counter.code,
        counter.severity,
        f"{_where(link)}: {increase} {counter.what} in {span:.0f} s{counter.after}",
        action=XidAction.DRAIN_AND_INSPECT,
        evidence={"link": link, counter.evidence_key: increase, "window_s": round(span, 3)},
        sticky=counter.sticky,
        occurrence=f"{link}:{increase}" if counter.sticky else "",
    )
