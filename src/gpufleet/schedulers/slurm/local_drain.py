"""Drain this node through Slurm when its health verdict is fail (``gpufleet health
--slurm-drain``, e.g. as Slurm's HealthCheckProgram).

The command is ``scontrol update NodeName=<node> State=DRAIN Reason=gpufleet: <code> <message>``
(scontrol(1)), built and run by `SlurmCommands` like every other Slurm program gpufleet runs, so
tests inject a runner and operators can point ``--scontrol`` at another binary.
"""

from __future__ import annotations

from gpufleet.health.tracker import HealthReport
from gpufleet.health.types import Finding, Severity
from gpufleet.schedulers.slurm.commands import SlurmCommands, reason_text


def drain_reason(finding: Finding) -> str:
    return reason_text(f"gpufleet: {finding.code} {finding.message}")


def drain_if_failed(
    report: HealthReport, *, commands: SlurmCommands, node: str | None = None
) -> list[str] | None:
    """Drain ``node`` (default: the report's node) with the worst finding as the reason when
    the verdict is fail; the argument list that ran, or None when nothing ran."""
    if report.verdict != Severity.FAIL:
        return None
    worst = next(f for f in report.findings if f.severity == Severity.FAIL)
    args = commands.drain_args(node or report.node, drain_reason(worst))
    commands.run(args)
    return args
