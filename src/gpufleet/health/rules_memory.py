"""Memory and XID rules: XID events by the catalog, ECC DBE and SBE rate, row remapping,
retired pages.

Sources: NVIDIA, "GPU Memory Error Management" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/)
for row remapping (pending remaps apply on the next GPU reset; a remap failure needs the board
inspected/RMA'd) and "Dynamic Page Retirement" (docs.nvidia.com/deploy/dynamic-page-retirement/)
for pre-Ampere page retirement; the XID catalog (``catalog/data/xid.yaml``) for what each XID
means and its immediate action. The row and page limits (512 uncorrectable remapped rows,
63 retired pages) are the figures of issue 3.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from gpufleet.catalog import XidAction, XidSeverity, load_catalog
from gpufleet.health.context import GpuContext
from gpufleet.health.registry import RuleParams, flag_finding, gpu_finding, register_rule
from gpufleet.health.types import Finding, Severity

_XID_SEVERITY = {
    XidSeverity.INFO: Severity.OK,
    XidSeverity.WARN: Severity.WARN,
    XidSeverity.FAIL: Severity.FAIL,
}


def sticky_action(action: XidAction) -> bool:
    """Whether a finding with this action stays until acknowledged (reset_gpu or stronger)."""
    return action.rank >= XidAction.RESET_GPU.rank


class XidParams(RuleParams):
    """A non-sticky XID finding clears ``quiet_s`` seconds after the code's last event."""

    quiet_s: float = Field(300.0, gt=0)
    ignore: list[int] = Field(default_factory=list, description="XID codes never reported")


@register_rule(
    "xid",
    scope="gpu",
    params=XidParams,
    description="XID events, with the XID catalog's severity and action (unknown codes: warn)",
)
def xid_rule(ctx: GpuContext, p: XidParams) -> Iterable[Finding]:
    by_code: dict[int, list[float]] = {}
    for ev in ctx.events:
        if ev.kind != "xid" or ev.xid is None or ev.xid in p.ignore:
            continue
        if ev.timestamp_s < ctx.now_s - p.quiet_s:
            continue
        by_code.setdefault(ev.xid, []).append(ev.timestamp_s)
    catalog = load_catalog()
    for code, times in sorted(by_code.items()):
        entry = catalog.xid(code)
        if entry is None:
            sev, action, name = Severity.WARN, XidAction.NONE, "unknown XID (not in the catalog)"
        else:
            sev, action, name = _XID_SEVERITY[entry.severity], entry.action, entry.name
        yield gpu_finding(
            ctx,
            "xid",
            f"XID_{code}",
            sev,
            f"XID {code}: {name} ({len(times)} event(s))",
            action=action,
            evidence={"xid": code, "events": len(times), "last_event_s": max(times)},
            sticky=sticky_action(action),
            occurrence=f"{max(times):.6f}",
        )


@register_rule(
    "ecc_dbe",
    scope="gpu",
    description="uncorrectable (double-bit) ECC errors since the last reset (volatile > 0)",
)
def ecc_dbe(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    dbe = ctx.window.latest("ecc_dbe_volatile")
    if dbe is not None and dbe > 0:
        yield gpu_finding(
            ctx,
            "ecc_dbe",
            "ECC_DBE_VOLATILE",
            Severity.FAIL,
            f"{dbe} uncorrectable ECC error(s) since the last reset",
            action=XidAction.RESET_GPU,
            evidence={"ecc_dbe_volatile": dbe},
            sticky=True,
            occurrence=str(dbe),
        )


class SbeRateParams(RuleParams):
    """Corrected (single-bit) ECC errors per hour above which the memory is degrading.

    Rationale for 10/h: a healthy HBM stack logs corrected errors rarely (most GPUs show a
    volatile SBE count of 0 for weeks); NVIDIA's memory-error documentation (see module
    docstring) treats repeated corrected errors as the precursor of row remaps and page
    retirement. Ten an hour is far above that background yet well before the remap capacity
    is at risk; tune it per fleet.
    """

    max_per_hour: float = Field(10.0, gt=0)
    min_span_s: float = Field(2.0, gt=0)  # shortest window a rate is computed over
    min_increase: int = Field(2, ge=1)  # a single corrected error is never a rate


@register_rule(
    "sbe_rate",
    scope="gpu",
    params=SbeRateParams,
    description="corrected (single-bit) ECC errors climbing faster than a threshold per hour",
)
def sbe_rate(ctx: GpuContext, p: SbeRateParams) -> Iterable[Finding]:
    inc = ctx.window.counter_rise("ecc_sbe_volatile", p.min_span_s, p.min_increase)
    if inc is None:
        return
    increase, span = inc
    per_hour = increase / span * 3600.0
    if per_hour > p.max_per_hour:
        yield gpu_finding(
            ctx,
            "sbe_rate",
            "ECC_SBE_RATE",
            Severity.WARN,
            f"{per_hour:.0f} corrected ECC errors per hour (threshold {p.max_per_hour:g})",
            evidence={
                "sbe_increase": increase,
                "window_s": round(span, 3),
                "per_hour": round(per_hour, 1),
                "threshold_per_hour": p.max_per_hour,
            },
        )


@register_rule(
    "row_remap_pending",
    scope="gpu",
    description="a row remap waits for a GPU reset to take effect",
)
def row_remap_pending(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    return flag_finding(
        ctx,
        "row_remap_pending",
        "remap_pending",
        "ROW_REMAP_PENDING",
        Severity.WARN,
        "row remapping pending: reset the GPU to apply it",
        action=XidAction.RESET_GPU,
    )


@register_rule(
    "row_remap_failure",
    scope="gpu",
    description="row remapping failed (no spare rows left in a bank)",
)
def row_remap_failure(ctx: GpuContext, p: RuleParams) -> Iterable[Finding]:
    return flag_finding(
        ctx,
        "row_remap_failure",
        "remap_failure",
        "ROW_REMAP_FAILURE",
        Severity.FAIL,
        "row remapping failed: the GPU's memory cannot be repaired in the field",
        action=XidAction.DRAIN_AND_INSPECT,
        sticky=True,
    )


class RemappedRowsParams(RuleParams):
    """Uncorrectable remapped rows at or above which to warn (issue 3: 512)."""

    max_uncorrectable: int = Field(512, ge=1)


@register_rule(
    "remapped_rows",
    scope="gpu",
    params=RemappedRowsParams,
    description="many rows remapped for uncorrectable errors (plan an RMA)",
)
def remapped_rows(ctx: GpuContext, p: RemappedRowsParams) -> Iterable[Finding]:
    unc = ctx.window.latest("remapped_rows_uncorrectable")
    if unc is not None and unc >= p.max_uncorrectable:
        yield gpu_finding(
            ctx,
            "remapped_rows",
            "REMAPPED_ROWS_HIGH",
            Severity.WARN,
            f"{unc} rows remapped for uncorrectable errors (limit {p.max_uncorrectable})",
            evidence={"remapped_rows_uncorrectable": unc, "limit": p.max_uncorrectable},
        )


class RetiredPagesParams(RuleParams):
    """Retired pages (SBE + DBE) at or above which the GPU fails (issue 3: 63)."""

    max_pages: int = Field(63, ge=1)


@register_rule(
    "retired_pages",
    scope="gpu",
    params=RetiredPagesParams,
    description="retired-page limit reached (pre-Ampere page retirement); pending retirement",
)
def retired_pages(ctx: GpuContext, p: RetiredPagesParams) -> Iterable[Finding]:
    sbe = ctx.window.latest("retired_pages_sbe")
    dbe = ctx.window.latest("retired_pages_dbe")
    if sbe is not None or dbe is not None:
        total = int(sbe or 0) + int(dbe or 0)
        if total >= p.max_pages:
            yield gpu_finding(
                ctx,
                "retired_pages",
                "RETIRED_PAGES_LIMIT",
                Severity.FAIL,
                f"{total} retired pages (limit {p.max_pages})",
                action=XidAction.DRAIN_AND_INSPECT,
                evidence={"retired_pages_sbe": sbe, "retired_pages_dbe": dbe, "limit": p.max_pages},
                sticky=True,
            )
    yield from flag_finding(
        ctx,
        "retired_pages",
        "retired_pages_pending",
        "RETIRED_PAGES_PENDING",
        Severity.WARN,
        "page retirement pending: reset the GPU to apply it",
        action=XidAction.RESET_GPU,
    )
