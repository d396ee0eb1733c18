"""Node-level rules: they see every GPU of the node at once.

The NVML library reports its version as ``<CUDA major>.<driver version>`` (e.g.
``13.580.159.04``, NVML API Reference, ``nvmlSystemGetNVMLVersion``); a user-space library
that differs from the loaded kernel driver is the classic "Driver/library version mismatch"
that only a reboot (or module reload) fixes.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.catalog import XidAction
from gpufleet.health.context import NodeContext
from gpufleet.health.registry import RuleParams, register_rule
from gpufleet.health.types import Finding, Severity


def _major(version: str | None) -> str | None:
    return None if not version else version.split(".", 1)[0]


@register_rule(
    "driver_version_mismatch",
    scope="node",
    description="NVML library and kernel driver versions differ (or GPUs disagree)",
)
def driver_version_mismatch(ctx: NodeContext, p: RuleParams) -> Iterable[Finding]:
    drivers = {g.info.driver_version for g in ctx.gpus if g.info and g.info.driver_version}
    nvmls = {g.info.nvml_version for g in ctx.gpus if g.info and g.info.nvml_version}
    cudas = {g.info.cuda_driver_version for g in ctx.gpus if g.info and g.info.cuda_driver_version}
    if ctx.driver_version:
        drivers.add(ctx.driver_version)
    if ctx.nvml_version:
        nvmls.add(ctx.nvml_version)
    if ctx.cuda_driver_version:
        cudas.add(ctx.cuda_driver_version)
    problems: list[str] = []
    if len(drivers) > 1:
        problems.append(f"driver versions differ: {sorted(drivers)}")
    for nvml in sorted(nvmls):
        cuda_major, _, lib = nvml.partition(".")
        if lib and drivers and lib not in drivers:
            problems.append(f"NVML library {lib} != driver {sorted(drivers)[0]}")
        majors = {_major(c) for c in cudas}
        if lib and majors and cuda_major not in majors:
            problems.append(f"NVML CUDA major {cuda_major} != CUDA driver {sorted(cudas)[0]}")
    if problems:
        yield Finding(
            rule="driver_version_mismatch",
            code="DRIVER_VERSION_MISMATCH",
            severity=Severity.FAIL,
            component="node",
            message="; ".join(problems) + " (reboot to load the installed driver)",
            action=XidAction.REBOOT_NODE,
            evidence={
                "driver_versions": sorted(drivers),
                "nvml_versions": sorted(nvmls),
                "cuda_driver_versions": sorted(cudas),
            },
            occurrence=";".join(sorted(drivers | nvmls)),
        )
