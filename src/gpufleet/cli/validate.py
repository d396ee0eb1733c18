"""`gpufleet validate`: acceptance and burn-in diagnostics, collectives, straggler analysis.

Exit code 0 pass, 1 warn, 2 fail, 3 bad or unusable input (`gpufleet.cli.app.main`). ``--out``
writes the versioned JSON result, ``--html`` the self-contained report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.cli.common import JsonOption, SeedOption, SimOption
from gpufleet.cli.output import console, emit_json
from gpufleet.errors import UsageError
from gpufleet.validate.results import Status, ValidationReport


def _gpus(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        indexes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise UsageError(f"--gpus {text!r}: expected indexes like 0,3") from exc
    if not indexes or indexes[0] < 0:
        raise UsageError(f"--gpus {text!r}: expected indexes like 0,3")
    return indexes


def _check_gpus(indexes: list[int] | None, backends: dict[str, Any]) -> None:
    """An index no node has would silently validate nothing but node-level tests."""
    if not indexes or not backends:
        return
    most = max(b.device_count() for b in backends.values())
    missing = [i for i in indexes if i >= most]
    if missing:
        raise UsageError(
            f"--gpus: no GPU {','.join(map(str, missing))} here",
            hint=f"GPU indexes are 0-{most - 1}",
        )


def _slurm_nodes() -> list[str]:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError("--slurm: not inside a Slurm allocation (SLURM_JOB_NODELIST unset)")
    from gpufleet.hostlist import expand

    return expand(nodelist, unique=True)


def _summary(report: ValidationReport) -> None:
    table = Table(title=f"gpufleet validate: {report.status.value.upper()}")
    for col in ("status", "test", "component", "message"):
        table.add_column(col, overflow="fold")
    style = {"fail": "red", "warn": "yellow", "pass": "green", "skip": "dim"}
    shown = report.failures()
    for r in shown[:200]:
        table.add_row(
            f"[{style[r.status.value]}]{r.status.value}[/]", r.test, r.component, r.message
        )
    if shown:
        console.print(table)
    for s in report.stragglers[:50]:
        console.print(
            f"[yellow]straggler[/] {s.component} {s.test}/{s.metric}: {s.value:.1f} "
            f"vs median {s.median:.1f} ({s.deviation_pct:+.1f} %, z {s.z:.1f})"
            + (f"; also {', '.join(s.also)}" if s.also else "")
        )
    counts = {st: sum(r.status is st for r in report.results) for st in Status}
    console.print(
        f"{len(report.results)} results: {counts[Status.PASS]} pass, {counts[Status.WARN]} warn, "
        f"{counts[Status.FAIL]} fail, {counts[Status.SKIP]} skip; {len(report.stragglers)} "
        f"straggler(s); {report.duration_s:.0f} s device time, {report.wall_s:.1f} s wall"
    )
    stress = next((r for r in report.results if r.test == "stress"), None)
    if stress is not None:
        console.print(f"stress ({stress.component}): {stress.message}")


def validate(
    sim: str | None = SimOption,
    seed: int = SeedOption,
    level: int = typer.Option(1, "--level", help="1 quick, 2 medium, 3 long."),
    only: list[str] = typer.Option(None, "--only", help="Run only these tests (repeat or a,b)."),
    skip: list[str] = typer.Option(None, "--skip", help="Skip these tests (repeat or a,b)."),
    duration: float | None = typer.Option(None, "--duration", help="Stress duration, seconds."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indexes, e.g. 0,3."),
    nodes: str | None = typer.Option(None, "--nodes", help="Host list, e.g. gpu[01-04],gpu07."),
    slurm: bool = typer.Option(False, "--slurm", help="Use the nodes of this Slurm allocation."),
    as_json: bool = JsonOption,
    out: Path | None = typer.Option(None, "--out", help="Write the JSON result here."),
    html: Path | None = typer.Option(None, "--html", help="Write the HTML report here."),
    config: Path | None = typer.Option(None, "--config", help="Thresholds YAML."),
    list_tests: bool = typer.Option(False, "--list", help="List the tests and exit."),
    launcher: str | None = typer.Option(
        None, "--launcher", help="Real multi-node: slurm, ssh or local (default slurm/ssh)."
    ),
    ranks_per_node: int | None = typer.Option(
        None, "--ranks-per-node", help="Real multi-node: ranks (GPUs) per node."
    ),
    master_addr: str | None = typer.Option(
        None, "--master-addr", help="Real multi-node: rendezvous address (default first host)."
    ),
) -> None:
    """Validate GPUs: health, bandwidth, memory, matmuls, stress, collectives, stragglers."""
    from gpufleet.hostlist import expand
    from gpufleet.validate.runner import RunOptions, run_suite
    from gpufleet.validate.suite import TESTS, select_tests, split_names
    from gpufleet.validate.thresholds import load_thresholds

    if list_tests:
        if as_json:
            emit_json(
                [
                    {
                        "name": t.name,
                        "level": t.level,
                        "scope": t.scope,
                        "description": t.description,
                    }
                    for t in TESTS.values()
                ]
            )
        else:
            for t in TESTS.values():
                console.print(f"{t.level}  {t.name:<22} {t.scope:<6} {t.description}")
        raise typer.Exit(0)
    if nodes and slurm:
        raise UsageError("--nodes and --slurm: give one of them")
    host_list = expand(nodes, unique=True) if nodes else _slurm_nodes() if slurm else None
    thr = load_thresholds(config)
    engine: Any
    if sim:
        from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
        from gpufleet.simvalidate import SimEngine

        spec = parse_fleet_spec(sim, seed=seed)
        if host_list:
            known = {n.name for n in spec.nodes}
            missing = [h for h in host_list if h not in known]
            if missing:
                raise UsageError(
                    f"--nodes: {missing} not in the simulated fleet",
                    hint=f"nodes are {sorted(known)[:5]}...",
                )
        clock = ManualClock()
        engine = SimEngine(SimFleet(spec, clock=clock), clock, nodes=host_list)
    elif host_list and len(host_list) > 1:  # real nodes: torch.distributed across them
        from gpufleet.validate.multinode_run import run_for_cli

        with console.status(f"validating {len(host_list)} nodes", spinner="dots") as st:
            report = run_for_cli(
                host_list,
                launcher=launcher or ("slurm" if slurm else "ssh"),
                level=level,
                only=split_names(only),
                skip=split_names(skip),
                thr=thr,
                ranks_per_node=ranks_per_node,
                master_addr=master_addr,
                progress=lambda t, c, s, m: st.update(f"{t} {c} {s.value if s else ''}"),
            )
        _finish(report, out, html, as_json)
    else:
        from gpufleet.validate.engine_torch import TorchEngine

        engine = TorchEngine.open()
    multi = len(engine.backends()) > 1
    selected = _gpus(gpus)
    _check_gpus(selected, engine.backends())
    tests = select_tests(level, split_names(only), split_names(skip), multi_node=multi)
    stress_s = duration if duration is not None else 900.0
    if stress_s <= 0:
        raise UsageError("--duration must be positive")
    opts = RunOptions(
        tests=tests,
        level=level,
        stress_s=stress_s,
        power_s=min(120.0, stress_s),
        gpus=selected,
        thresholds=thr,
    )
    report = run_suite(engine, opts) if as_json else _run_with_progress(engine, opts, run_suite)
    _finish(report, out, html, as_json)


def _finish(
    report: ValidationReport, out: Path | None, html: Path | None, as_json: bool
) -> NoReturn:
    from gpufleet.validate.report_html import render_html

    if out:
        report.write_json(out)
    if html:
        html.write_text(render_html(report), encoding="utf-8")
    if as_json:
        emit_json(report.to_dict())
    else:
        _summary(report)
    raise typer.Exit(report.exit_code)


def _run_with_progress(engine: Any, opts: Any, run_suite: Any) -> ValidationReport:
    """Rich live progress: one bar per test, counting GPUs (or nodes) done and failing."""
    n_gpus = sum(b.device_count() for b in engine.backends().values())
    n_nodes = len(engine.backends())
    from gpufleet.validate.suite import TESTS

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[bad]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        tasks: dict[str, Any] = {}
        bad: dict[str, int] = {}
        for name in opts.tests:
            scope = TESTS[name].scope
            total = (
                n_gpus
                if scope == "gpu"
                else n_nodes
                if scope == "node" or name == "pairwise"
                else 1
            )
            tasks[name] = progress.add_task(f"{name:<22}", total=total, bad="")

        def cb(test: str, component: str, status: Status | None, message: str) -> None:
            if test not in tasks:
                return
            if status is None:
                progress.update(tasks[test], description=f"{test:<22} {component}")
                return
            if status in (Status.FAIL, Status.WARN):
                bad[test] = bad.get(test, 0) + 1
                progress.console.print(
                    f"[{'red' if status is Status.FAIL else 'yellow'}]"
                    f"{status.value}[/] {test} {component}: {message}"
                )
            progress.update(
                tasks[test],
                advance=1,
                description=f"{test:<22} {component}",
                bad=f"[red]{bad[test]} bad[/]" if bad.get(test) else "",
            )

        report: ValidationReport = run_suite(engine, opts, cb)
        for t in tasks.values():
            task = progress.tasks[t]
            progress.update(t, completed=task.total)
    return report


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the app."""
    app.command("validate")(validate)
