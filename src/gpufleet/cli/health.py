"""`gpufleet health`: the node verdict, findings and actions (exit codes for Slurm/Nagios), and
`gpufleet health ack` to acknowledge a sticky finding."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from gpufleet.cli.common import (
    JsonOption,
    SeedOption,
    SimOption,
    TokenFileOption,
    http_url,
    read_token,
)
from gpufleet.cli.output import console, emit_json, err_console, fit, print_error
from gpufleet.devices.deadline import with_deadlines
from gpufleet.devices.types import GpuEvent
from gpufleet.errors import ConfigError, GpufleetError, UsageError
from gpufleet.health.acks import (
    Acknowledgement,
    AckStore,
    FileAckStore,
    MemoryAckStore,
    default_state_dir,
    new_ack_id,
)
from gpufleet.health.collect import collect_node
from gpufleet.health.config import load_health_config
from gpufleet.health.context import GpuHealthInput, GpuWindow, NodeHealthInput
from gpufleet.health.tracker import HealthReport, HealthTracker
from gpufleet.health.types import Severity
from gpufleet.schedulers.slurm import health_check as slurm_check
from gpufleet.schedulers.slurm.commands import Runner, subprocess_runner
from gpufleet.schedulers.slurm.local_drain import parse_max_drained

# Injectable side effect: tests replace it with a recorder (see tests/health/test_cli.py).
RUNNER: Runner = subprocess_runner

health_app = typer.Typer(
    help="Node health: verdict, findings and recommended actions.",
    invoke_without_command=True,
    no_args_is_help=False,
)

_COLOURS = {Severity.OK: "green", Severity.WARN: "yellow", Severity.FAIL: "red"}


def _reports_sim(
    spec: str, seed: int, node: str | None, duration_s: float, tracker_for: Any
) -> list[HealthReport]:
    from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec

    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(spec, seed=seed), clock=clock)
    names = [node] if node else list(fleet.nodes)
    reports = []
    for name in names:
        backend = with_deadlines(fleet.node(name).backend())
        try:
            data = collect_node(backend, duration_s=duration_s, sleep=clock.advance, clock=clock)
        finally:
            backend.close()
        reports.append(tracker_for(name, clock).evaluate(data))
    return reports


def _reports_local(node: str | None, duration_s: float, tracker_for: Any) -> list[HealthReport]:
    from gpufleet.devices.discovery import open_local_nvml

    fleet = open_local_nvml().bounded()
    try:
        backend = fleet.backends[0]
        data = collect_node(backend, duration_s=duration_s)
    finally:
        fleet.close()
    if node:
        from dataclasses import replace

        data = replace(data, node=node)
    return [tracker_for(data.node, time.time).evaluate(data)]


def _reports_import(imports: list[Path], tracker_for: Any) -> tuple[list[HealthReport], Any]:
    """Judge captured nvidia-smi reports offline: each report is one sample per GPU at the
    report's time; a GPU the report could not read is judged as lost."""
    from gpufleet.devices.smi.importer import import_reports

    for path in imports:
        if path.is_dir():
            raise ConfigError(f"{path}: is a directory; expected an nvidia-smi -q -x report")
    result = import_reports(imports)
    reports = []
    for node in result.nodes:
        rep = node.report
        at_s = rep.timestamp_s if rep.timestamp_s is not None else time.time()
        gpus = [
            GpuHealthInput(g.info.index, g.info.uuid, g.info, GpuWindow.of([g.sample]))
            for g in rep.gpus
        ]
        # unreadable GPUs: "gpu[3]/... (bus): why" -> lost GPU 3 (no identity)
        taken = {g.index for g in gpus}
        for message in rep.unreadable:
            m = re.match(r"gpu\[(\d+)\]", message)
            index = int(m[1]) if m else max(taken, default=-1) + 1
            taken.add(index)
            lost = GpuEvent(index, None, "gpu_lost", at_s, detail=message)
            gpus.append(GpuHealthInput(index, None, None, GpuWindow(), (lost,), lost=True))
        data = NodeHealthInput(
            node=node.name,
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            driver_version=rep.driver_version,
            cuda_driver_version=rep.cuda_version,
        )
        reports.append(tracker_for(node.name, lambda at=at_s: at).evaluate(data))
    return reports, result


def _render(report: HealthReport) -> None:
    colour = _COLOURS.get(report.verdict, "magenta")
    console.print(
        f"[bold]{report.node}[/]: [{colour}]{report.verdict.word.upper()}[/] "
        f"({len(report.findings)} finding(s), {len(report.gpu_verdicts)} GPU(s))"
    )
    if report.findings:
        table = Table()
        for col in ("severity", "gpu", "component", "code", "message", "action", "sticky"):
            # The code and component are what `health ack CODE COMPONENT` takes: never split.
            table.add_column(col, overflow="fold", no_wrap=col not in ("message", "component"))
        for f in report.findings:
            c = _COLOURS.get(f.severity, "magenta")
            table.add_row(
                f"[{c}]{f.severity.word}[/]",
                "" if f.gpu_index is None else str(f.gpu_index),
                f.component,
                f.code,
                f.message,
                f.action.value,
                "yes" if f.sticky else "",
            )
        console.print(fit(table))
    for err in report.errors:
        err_console.print(f"[yellow]rule error:[/] {escape(str(err))}")


def _store(state_dir: Path | None, persistent: bool) -> AckStore:
    if state_dir is not None:
        return FileAckStore(state_dir)
    return FileAckStore(default_state_dir()) if persistent else MemoryAckStore()


@health_app.callback()
def health(
    ctx: typer.Context,
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
    exit_code: bool = typer.Option(
        False, "--exit-code", help="Exit 0 ok, 1 warn, 2 fail, 3 unknown (Slurm/Nagios)."
    ),
    slurm_drain: bool = typer.Option(
        False,
        "--slurm-drain",
        help="Drain this Slurm node on fail (finding as reason) within the circuit breaker; "
        "resume it when healthy if this check drained it (see docs/slurm.md).",
    ),
    controller: str | None = typer.Option(
        None, "--controller", help="With --slurm-drain: ask this controller's circuit breaker."
    ),
    token_file: Path | None = TokenFileOption,
    max_drained: str | None = typer.Option(
        None,
        "--max-drained",
        help="With --slurm-drain and no --controller: most Slurm nodes out at once, "
        "N or P% (default 10%, at least 1).",
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML file with a health: section."),
    duration: float = typer.Option(3.0, "--duration", min=0, help="Seconds to sample."),
    time_budget: float = typer.Option(
        slurm_check.BUDGET_S,
        "--time-budget",
        min=1.0,
        max=3600.0,
        help="With --slurm-drain: seconds the whole check may take, start-up included; a "
        "Slurm call that would run past it is not made (the node is left as it is, exit 3).",
    ),
    node: str | None = typer.Option(
        None, "--node", help="Node name (Slurm name; with --sim: which node)."
    ),
    scontrol: str = typer.Option("scontrol", "--scontrol", help="Path of scontrol."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Ack log and sticky findings (default: the state dir)."
    ),
    imports: list[Path] | None = typer.Option(
        None,
        "--import",
        help="Judge captured nvidia-smi -q -x (or -q) report(s) offline, one per node.",
        metavar="FILE",
    ),
) -> None:
    """Check this node's GPUs (or a simulated fleet's nodes) and print the verdict."""
    if ctx.invoked_subcommand is not None:
        return
    imported: Any = None
    started = time.monotonic()
    try:
        if sim and imports:
            raise UsageError("--sim and --import are mutually exclusive: give one or the other")
        check = _slurm_check(
            slurm_drain, scontrol, controller, token_file, max_drained, started, time_budget
        )
        cfg = load_health_config(config)
        persistent = sim is None and not imports

        def tracker_for(name: str, clock: Any) -> HealthTracker:
            return HealthTracker(cfg, clock=clock, store=_store(state_dir, persistent))

        if sim:
            reports = _reports_sim(sim, seed, node, duration, tracker_for)
        elif imports:
            reports, imported = _reports_import(imports, tracker_for)
        else:
            reports = _reports_local(node, duration, tracker_for)
        outcomes = slurm_check.run(reports, node, check) if check else []
    except GpufleetError as exc:
        if not exit_code:
            raise
        print_error(exc.message, exc.hint)
        raise typer.Exit(int(Severity.UNKNOWN)) from exc
    verdict = _overall(reports)
    failed: list[str] = imported.failed if imported is not None else []
    if failed and verdict != Severity.FAIL:
        verdict = Severity.UNKNOWN  # a report that could not be read is not a passing one
    drained = [list(o.argv) for o in outcomes if o.action == "drained"]
    if as_json:
        doc: dict[str, Any] = {
            "verdict": verdict.word,
            "nodes": [r.to_dict() for r in reports],
            "drained": drained,
        }
        if imported is not None:
            doc["import"] = {"failed": failed, "warnings": imported.warnings}
        if slurm_drain:
            doc["slurm"] = slurm_check.summary(outcomes)
        emit_json(doc)
    else:
        for r in reports:
            _render(r)
        for args in drained:
            console.print(f"[red]drained[/]: {' '.join(args)}", highlight=False)
        if imported is not None:
            for w in imported.warnings:
                console.print(f"[yellow]warning:[/] {w}", highlight=False)
            for f in failed:
                console.print(f"[red]not imported:[/] {f}", highlight=False)
    if exit_code:
        undecided = any(o.action == "undecided" for o in outcomes)
        raise typer.Exit(int(Severity.UNKNOWN if undecided else verdict))
    if failed:
        raise typer.Exit(1)  # partial import: judged what parsed, listed what did not


def _slurm_check(
    enabled: bool,
    scontrol: str,
    controller: str | None,
    token_file: Path | None,
    max_drained: str | None,
    started: float,
    budget_s: float = slurm_check.BUDGET_S,
) -> slurm_check.SlurmCheck | None:
    """What ``--slurm-drain`` asks for (checked before any GPU is read); ``sinfo`` is taken
    from the directory of ``--scontrol`` when that is a path."""
    if not enabled:
        if controller or max_drained:
            raise UsageError("--controller and --max-drained go with --slurm-drain")
        return None
    if controller and max_drained:
        raise UsageError("give --controller (its circuit breaker decides) or --max-drained")
    token = None
    if controller:
        http_url(controller, "--controller")
        token = read_token(None, token_file)
        if not token:
            raise UsageError("--controller needs --token-file (or GPUFLEET_TOKEN_FILE)")
    elif max_drained is not None:
        parse_max_drained(max_drained)
    sinfo = os.path.join(os.path.dirname(scontrol), "sinfo") if os.sep in scontrol else "sinfo"
    return slurm_check.SlurmCheck(
        scontrol=scontrol,
        sinfo=sinfo,
        controller=controller,
        token=token,
        max_drained=max_drained,
        runner=RUNNER,
        started_s=started,
        startup_s=slurm_check.startup_s(),
        budget_s=budget_s,
    )


def _overall(reports: list[HealthReport]) -> Severity:
    if not reports:
        return Severity.UNKNOWN
    if any(r.verdict == Severity.FAIL for r in reports):
        return Severity.FAIL
    if any(r.verdict == Severity.UNKNOWN for r in reports):
        return Severity.UNKNOWN
    return max(r.verdict for r in reports)


@health_app.command("ack")
def ack(
    code: str = typer.Argument(..., help="Finding code, e.g. ECC_DBE_VOLATILE or XID_79."),
    component: str = typer.Argument(..., help="GPU UUID (or gpu<index>) or 'node'."),
    who: str = typer.Option(..., "--who", help="Who acknowledges."),
    why: str = typer.Option(..., "--why", help="Why (ticket, action taken)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Where the ack log lives."),
    node: str | None = typer.Option(None, "--node", help="Node of the finding (default: any)."),
    as_json: bool = JsonOption,
) -> None:
    """Acknowledge a sticky finding: it clears, and the ack is logged with who and why."""
    if not who.strip() or not why.strip():
        raise ConfigError("--who and --why must not be empty")
    store = FileAckStore(state_dir or default_state_dir())
    matches = [
        (n, f)
        for n, findings in store.nodes_with_sticky().items()
        for f in findings
        if f.code == code and f.component == component and (node is None or n == node)
    ]
    if not matches:
        known = [
            f"{f.code} {f.component} ({n})"
            for n, fs in store.nodes_with_sticky().items()
            for f in fs
        ]
        raise ConfigError(
            f"{store.dir}: no active sticky finding {code} on {component}",
            hint=f"active: {', '.join(known)}" if known else "no sticky findings recorded here",
        )
    acks = []
    for n, f in matches:
        a = Acknowledgement(
            code=code,
            component=component,
            who=who,
            why=why,
            at_s=time.time(),
            node=n,
            occurrence=f.occurrence,
            id=new_ack_id(),
        )
        store.append(a)
        acks.append(a)
    if as_json:
        emit_json({"acknowledged": [a.to_dict() for a in acks], "log": str(store.log_path)})
    else:
        for a in acks:
            console.print(f"acknowledged {a.code} on {a.component} ({a.node}) by {a.who}: {a.why}")


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the app."""
    app.add_typer(health_app, name="health")
