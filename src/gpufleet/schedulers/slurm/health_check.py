"""The Slurm side of ``gpufleet health --slurm-drain``: build the guard (controller or local
limit), bound every call by what is left of the check's time budget, apply `local_drain.act`
to each report and log each outcome with a timestamp on stderr (the generated
HealthCheckProgram wrapper appends stderr to a log file, since slurmd keeps no output).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import GpufleetError
from gpufleet.schedulers.slurm.commands import Runner, SlurmBinaries, SlurmCommands
from gpufleet.schedulers.slurm.local_drain import (
    DEFAULT_MAX_DRAINED,
    HEALTHY,
    ControllerGuard,
    DrainGuard,
    LocalGuard,
    Outcome,
    act,
)

if TYPE_CHECKING:
    from gpufleet.health.tracker import HealthReport

# `gpufleet health` as HealthCheckProgram must finish within this (issue 14: "within 10 s with
# any number of hung GPUs"); slurmd itself kills the program after 60 s (slurm.conf(5)).
BUDGET_S = 10.0
MARGIN_S = 0.5  # interpreter exit, output
PER_CALL_MAX_S = 3.0


@dataclass(frozen=True)
class SlurmCheck:
    """How the check reaches Slurm and whom it asks before draining."""

    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    controller: str | None = None
    token: str | None = None
    max_drained: str | None = None
    runner: Runner | None = None
    started_s: float | None = None  # time.monotonic() when the check began
    startup_s: float = 0.0  # time the process spent before that (`startup_s()`)
    clock: Callable[[], float] = time.monotonic
    budget_s: float = BUDGET_S  # ``--time-budget``: the whole check ends within this

    def time_left(self) -> float:
        """Seconds left of the budget, counted from ``started_s`` plus ``startup_s``."""
        started = self.started_s if self.started_s is not None else self.clock()
        return self.budget_s - MARGIN_S - self.startup_s - (self.clock() - started)

    def per_call_s(self) -> float:
        """Each program or HTTP call gets a quarter of what is left (sinfo, the controller,
        scontrol, sinfo again), at most 3 s: together they end within the budget."""
        return max(0.05, min(PER_CALL_MAX_S, self.time_left() / 4))

    def commands(self) -> SlurmCommands:
        b = SlurmBinaries(scontrol=self.scontrol, sinfo=self.sinfo)
        if self.runner is not None:
            return SlurmCommands(binaries=b, runner=self.runner, timeout_s=self.per_call_s())
        return SlurmCommands(binaries=b, timeout_s=self.per_call_s())

    def guard(self) -> tuple[DrainGuard, Callable[[], None]]:
        """The guard, and what closes it."""
        if self.controller is None:
            return LocalGuard(self.max_drained or DEFAULT_MAX_DRAINED), lambda: None
        from gpufleet.client import ApiError, Client

        client = Client(self.controller, self.token or "", timeout_s=self.per_call_s())

        def node_state(name: str) -> str | None:
            try:
                return client.node(name).node.state  # validated: a NodeDetail has a state
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise

        def summary() -> dict[str, Any]:
            return client.summary().model_dump(mode="json")

        return ControllerGuard(summary, node_state, url=self.controller), client.close


def startup_s() -> float:
    """What the process spent before the check began (interpreter start, imports), when this
    process is the ``gpufleet`` program (as slurmd runs it); 0 inside another program (a test
    runner, the Python API), whose age says nothing about the check."""
    prog = Path(sys.argv[0] if sys.argv else "")
    is_gpufleet = prog.name == "gpufleet" or (
        prog.name == "__main__.py" and prog.parent.name == "gpufleet"
    )
    return (process_age_s() or 0.0) if is_gpufleet else 0.0


def process_age_s() -> float | None:
    """How long this process has run: proc(5) ``/proc/self/stat`` field 22 (start time, clock
    ticks after boot) against ``/proc/uptime``; None where /proc cannot say."""
    try:
        stat = Path("/proc/self/stat").read_text(encoding="ascii")
        uptime = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22; fields 1-2 end at ")"
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def slurm_name(report_node: str, given: str | None, only_report: bool = True) -> str:
    """The node's Slurm name: ``--node``, else ``SLURMD_NODENAME`` (slurmd sets it for the
    health check; only when there is one report), else the report's (host) name."""
    from_env = os.environ.get("SLURMD_NODENAME") if only_report else None
    return given or from_env or report_node


def run(reports: Sequence[HealthReport], node: str | None, check: SlurmCheck) -> list[Outcome]:
    """Act on each report; every outcome is logged. Nothing raises: a guard or Slurm that
    cannot answer (or no time left) is an ``undecided`` outcome."""
    outcomes: list[Outcome] = []
    guard: DrainGuard | None = None
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        for r in reports:
            name = slurm_name(r.node, node, len(reports) == 1)
            if check.time_left() < 1.0:
                outcomes.append(Outcome("undecided", name, "no time left to ask Slurm"))
                continue
            if guard is None:
                try:
                    guard, close = check.guard()
                except GpufleetError as exc:
                    outcomes.append(Outcome("undecided", name, exc.message))
                    continue
            outcomes.append(act(r, node=name, commands=check.commands(), guard=guard))
    finally:
        close()
    for o in outcomes:
        if o.action != "kept" or o.detail != HEALTHY:  # a healthy node in service: no line
            say(o)
    return outcomes


def say(o: Outcome) -> None:
    """One timestamped line on stderr per outcome (what the wrapper's log file keeps)."""
    line = f"{o.node}: {o.action}: {o.detail}"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"{stamp} gpufleet health --slurm-drain: {line}", file=sys.stderr, flush=True)


def summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The ``slurm`` part of ``gpufleet health --json``."""
    return {"actions": [o.to_dict() for o in outcomes]}
