"""Drain the local node through Slurm's ``scontrol`` when the health verdict is fail.

The command is an argument list (no shell), run by an injected runner, so tests record it and
operators can point ``--scontrol`` at another binary. Syntax: Slurm ``scontrol`` man page,
``update NodeName=<name> State=DRAIN Reason=<reason>`` (slurm.schedmd.com/scontrol.html).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from gpufleet.errors import GpufleetError
from gpufleet.health.tracker import HealthReport
from gpufleet.health.types import Finding, Severity

Runner = Callable[[Sequence[str]], int]
MAX_REASON_CHARS = 200  # keep sinfo -R readable


def run_subprocess(args: Sequence[str]) -> int:
    """The default runner: run ``args`` without a shell, 30 s at most; the exit status."""
    try:
        done = subprocess.run(list(args), check=False, timeout=30, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise GpufleetError(f"{args[0]}: not found", hint="set --scontrol PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise GpufleetError(f"{args[0]} did not finish within 30 s") from exc
    if done.returncode != 0:
        raise GpufleetError(
            f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()[:200]}"
        )
    return done.returncode


def drain_reason(finding: Finding) -> str:
    text = f"gpufleet: {finding.code} {finding.message}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def drain_args(node: str, finding: Finding, scontrol: str = "scontrol") -> list[str]:
    """``scontrol update nodename=<node> state=drain reason=gpufleet: <code> <message>``."""
    return [
        scontrol,
        "update",
        f"nodename={node}",
        "state=drain",
        f"reason={drain_reason(finding)}",
    ]


def drain_if_failed(
    report: HealthReport,
    *,
    node: str | None = None,
    scontrol: str = "scontrol",
    runner: Runner = run_subprocess,
) -> list[str] | None:
    """Drain ``node`` (default: the report's node) with the worst finding as the reason when
    the verdict is fail; the argument list that ran, or None when nothing ran."""
    if report.verdict != Severity.FAIL:
        return None
    worst = next(f for f in report.findings if f.severity == Severity.FAIL)
    args = drain_args(node or report.node, worst, scontrol)
    runner(args)
    return args
