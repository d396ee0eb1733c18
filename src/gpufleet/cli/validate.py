"""`gpufleet validate`: acceptance and burn-in diagnostics, collectives, straggler analysis.

Exit code 0 pass, 1 warn, 2 fail, 3 bad or unusable input (`gpufleet.cli.app.main`). ``--out``
writes the versioned JSON result, ``--html`` the self-contained report. ``--controller URL
--token-file F`` posts each node's verdict to the control plane (``POST
/api/v1/validation-results``), where a node waiting in ``validating`` goes in service on a pass
or warn and to repair on a fail (the gate into service, issue 14).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.cli.common import JsonOption, SeedOption, SimOption, TokenFileOption, read_token
from gpufleet.cli.output import console, emit_json
from gpufleet.cli.process import CaOption
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
    controller: str | None = typer.Option(
        None,
        "--controller",
        help="Post each node's verdict to this control plane (its gate into service).",
    ),
    token_file: Path | None = TokenFileOption,
    ca: Path | None = CaOption,
    topology: Path | None = typer.Option(
        None,
        "--topology",
        help="Cable map CSV (gpufleet plan) or Slurm topology.conf: group pairwise by leaf/rail.",
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
    post = _poster(controller, token_file, ca, level) if controller else None
    host_list = expand(nodes, unique=True) if nodes else _slurm_nodes() if slurm else None
    thr = load_thresholds(config)
    from gpufleet.validate.fabric_groups import load_topology

    fabric = load_topology(topology) if topology else None
    engine: Any
    if sim:
        from gpufleet import simvalidate  # noqa: F401  (registers the "sim" engine)
        from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
        from gpufleet.validate.engines import open_engine

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
        engine = open_engine("sim", fleet=SimFleet(spec, clock=clock), clock=clock, nodes=host_list)
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
                topology=fabric,
                progress=lambda t, c, s, m: st.update(f"{t} {c} {s.value if s else ''}"),
            )
        _finish(report, out, html, as_json, post)
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
        topology=fabric,
    )
    report = run_suite(engine, opts) if as_json else _run_with_progress(engine, opts, run_suite)
    _finish(report, out, html, as_json, post)


Poster = Any  # Callable[[ValidationReport], list[dict[str, Any]]]


def _poster(controller: str, token_file: Path | None, ca: Path | None, level: int) -> Poster:
    """Checked before anything runs: the token is readable and the URL is one."""
    from gpufleet.cli.common import http_url

    url = http_url(controller, "--controller")
    token = read_token(None, token_file)
    if not token:
        raise UsageError(
            "--controller needs --token-file (or GPUFLEET_TOKEN_FILE): an operator token, "
            "or the node's own agent token"
        )
    if ca is not None and not ca.is_file():
        raise UsageError(f"--ca {ca}: no such file")

    def post(report: ValidationReport) -> list[dict[str, Any]]:
        from gpufleet.client import Client

        answers = []
        with Client(url, token, ca=ca) as client:
            for body in post_bodies(report, level):
                node = client.request("POST", "/validation-results", json=body)
                answers.append({"node": body["node"], "verdict": body["verdict"], **_state(node)})
        return answers

    return post


def _state(node: Any) -> dict[str, Any]:
    return {"state": node.get("state"), "reason": node.get("state_reason")} if node else {}


def post_bodies(report: ValidationReport, level: int) -> list[dict[str, Any]]:
    """One validation result per node of ``report``: its verdict (worst status of its GPUs,
    itself and its links; a node with only skipped tests warns), a summary naming what
    failed, and that node's results."""
    from dataclasses import asdict

    from gpufleet.jsonable import to_jsonable
    from gpufleet.validate.suite import TESTS

    out = []
    # the nodes tested: fleet-wide results (collectives across nodes) belong to no one node
    nodes = {
        r.node for r in report.results if r.test not in TESTS or TESTS[r.test].scope != "fleet"
    }
    for node, status in sorted(report.node_status().items()):
        if node not in nodes:
            continue
        verdict = status.value if status.value in ("pass", "warn", "fail") else "warn"
        mine = [
            r for r in report.results if r.node == node or (r.link and node in r.link.split("<->"))
        ]
        bad = [r for r in mine if r.status.value == verdict and verdict != "pass"]
        summary = "; ".join(
            f"{r.test}{'' if r.gpu is None else f' GPU {r.gpu}'}: {r.message}" for r in bad[:5]
        )
        out.append(
            {
                "node": node,
                "verdict": verdict,
                "summary": f"level {level}: {summary or 'all checks pass'}"[:2000],
                "level": level,
                "source": "gpufleet validate",
                "results": to_jsonable([asdict(r) for r in mine]),
            }
        )
    return out


def _finish(
    report: ValidationReport,
    out: Path | None,
    html: Path | None,
    as_json: bool,
    post: Poster | None = None,
) -> NoReturn:
    from gpufleet.validate.report_html import render_html

    posted = post(report) if post is not None else None
    if out:
        report.write_json(out)
    if html:
        html.write_text(render_html(report), encoding="utf-8")
    if as_json:
        doc = report.to_dict()
        if posted is not None:
            doc["posted"] = posted
        emit_json(doc)
    else:
        _summary(report)
        for p in posted or []:
            console.print(
                f"posted {p['verdict']} for {p['node']}: now {p.get('state')}", highlight=False
            )
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
