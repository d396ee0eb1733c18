"""The readiness phases in order (one registry), running them, and their findings for the
agent and for `gpufleet validate` level 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.doctor import Check, overall_status
from gpufleet.errors import GpufleetError
from gpufleet.health.types import Finding, Severity
from gpufleet.readiness.checks_driver import check_cuda, check_driver
from gpufleet.readiness.checks_host import check_host, check_network
from gpufleet.readiness.checks_io import check_containers, check_gpudirect
from gpufleet.readiness.host import Host, Runner, SystemRunner
from gpufleet.readiness.types import Expectations, NvmlFacts
from gpufleet.wire.validation_report import Status, TestResult

Phase = Callable[[Host, NvmlFacts, Expectations], list[Check]]

PHASES: dict[str, Phase] = {
    "driver": check_driver,
    "cuda": check_cuda,
    "containers": lambda h, _n, e: check_containers(h, e),
    "gpudirect": lambda h, _n, e: check_gpudirect(h, e),
    "network": lambda h, _n, e: check_network(h, e),
    "host": check_host,
}
"""Phase name -> its checks, in the order an installation proceeds."""


def run_readiness(
    host: Host | None = None,
    nvml: NvmlFacts | None = None,
    expect: Expectations | None = None,
) -> list[Check]:
    """Every phase's checks; a phase that raises gives one "unknown" check, never a crash."""
    host = host or Host()
    nvml = nvml or NvmlFacts()
    expect = expect or Expectations()
    out: list[Check] = []
    for phase, fn in PHASES.items():
        try:
            out.extend(fn(host, nvml, expect))
        except (OSError, ValueError, GpufleetError) as exc:
            out.append(Check(phase, "unknown", f"{phase} checks failed: {exc}", phase=phase))
    return out


def nvml_facts(backend: GpuBackend) -> NvmlFacts:
    """Driver version, GPU count and memory from a backend; empty where NVML does not answer."""
    try:
        count = backend.device_count()
    except GpufleetError:
        return NvmlFacts()
    versions = backend.system_versions() if hasattr(backend, "system_versions") else {}
    memory: list[int] = []
    for i in range(count):
        try:
            size = backend.device_info(i).memory_total_bytes
        except GpufleetError:
            continue
        if size:
            memory.append(size)
    return NvmlFacts(
        driver_version=versions.get("driver_version"),
        gpu_count=count,
        gpu_memory_bytes=tuple(memory),
    )


_SEVERITY = {"warn": Severity.WARN, "fail": Severity.FAIL, "unknown": Severity.UNKNOWN}


def to_findings(checks: list[Check]) -> list[Finding]:
    """Checks that are not ok (nor skipped) as node findings: rule "readiness", code
    ``READINESS_<PHASE>_<NAME>``, the hint in the evidence."""
    out: list[Finding] = []
    for c in checks:
        severity = _SEVERITY.get(c.status)
        if severity is None:
            continue
        code = f"READINESS_{c.phase}_{c.name}".upper()
        code = "".join(ch if ch.isalnum() else "_" for ch in code)
        out.append(
            Finding(
                rule="readiness",
                code=code,
                severity=severity,
                component="node",
                message=c.detail,
                evidence={"phase": c.phase, "check": c.name, "hint": c.hint},
                occurrence=c.detail,
            )
        )
    return out


def readiness_findings(
    root: Path | str = "/",
    runner: Runner | None = None,
    nvml: NvmlFacts | None = None,
    expect: Expectations | None = None,
) -> list[Finding]:
    """The readiness checks of the host under ``root`` as findings (what is not ok): the agent
    runs this at start, validate level 1 includes it."""
    host = Host(Path(root), runner or SystemRunner())
    return to_findings(run_readiness(host, nvml, expect))


def readiness_test_result(node: str, checks: list[Check]) -> TestResult:
    """The readiness checks of one node as one `gpufleet validate` level-1 result (test
    "readiness"): fail when a check fails, warn on warnings or checks that could not be made,
    pass otherwise; the problems in the message, every check in ``details``."""
    verdict = overall_status(checks)
    status = {"fail": Status.FAIL, "warn": Status.WARN, "unknown": Status.WARN}.get(
        verdict, Status.PASS
    )
    problems = [c for c in checks if c.status in ("fail", "warn", "unknown")]
    message = (
        "; ".join(f"{c.phase}/{c.name}: {c.detail}" for c in problems[:3])
        if problems
        else f"{len(checks)} readiness checks ok"
    )
    if len(problems) > 3:
        message += f" (+{len(problems) - 3} more)"
    details = {f"{c.phase}/{c.name}": {"status": c.status, "hint": c.hint} for c in checks}
    return TestResult("readiness", node, status, message, details=details)
