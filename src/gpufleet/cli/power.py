"""`gpufleet power sweep|apply|restore`: the power-limit advisor on this machine's GPUs (or a
simulated node, ``--sim``, where time runs on a manual clock so a sweep takes seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from gpufleet.cli.common import JsonOption, SeedOption, SimOption, TokenFileOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json, err_console, fit
from gpufleet.cli.remote import BearerTokenOption, Remote
from gpufleet.errors import ConfigError, UsageError

power_app = typer.Typer(
    help="Tune GPU power limits: sweep, apply, restore; fleet orders and rack budgets.",
    no_args_is_help=True,
)
GpusOption = typer.Option(None, "--gpus", help="GPU indexes, e.g. 0,1 (default all).")
DryRunOption = typer.Option(False, "--dry-run", help="Show what would change; set nothing.")


def _open(sim: str | None, seed: int) -> tuple[Any, Any, Any]:
    """(backend, simulated node or None, its manual clock or None): the first node."""
    if sim:
        from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec

        clock = ManualClock()
        fleet = SimFleet(parse_fleet_spec(sim, seed=seed), clock=clock)
        node = next(iter(fleet.nodes.values()))
        return node.backend(), node, clock
    from gpufleet.devices.discovery import open_local_nvml

    return open_local_nvml().backends[0], None, None


def _gpus(text: str | None, backend: Any) -> list[int]:
    count = int(backend.device_count())
    if text is None:
        return list(range(count))
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise UsageError(f"--gpus: expected indexes like 0,1, got {text!r}") from exc
    bad = [g for g in out if not 0 <= g < count]
    if bad or not out:
        raise UsageError(f"--gpus: {text!r}: this node has GPUs 0-{count - 1}")
    return out


def _runner(
    workload: str, rate_regex: str | None, unit: str, backend: Any, node: Any, clock: Any
) -> Any:
    from gpufleet.energy.workloads import BUILTIN, CommandRunner, SimRunner

    command = workload
    if workload in BUILTIN:
        if node is not None:
            return SimRunner(node, backend, clock, workload)
        import sys

        from gpufleet.energy import loadgen

        # real GPUs: our own load generator, run as a command (it needs PyTorch)
        command = f"{sys.executable} -m gpufleet.energy.loadgen {workload} --seconds 86400"
        rate_regex, unit = loadgen.RATE_REGEX, loadgen.UNITS[workload]
    if rate_regex is None:
        raise UsageError("--workload COMMAND needs --rate-regex 'PATTERN (number group)'")

    def sample_power(g: int) -> float | None:
        return backend.sample_fast(g).power_w  # type: ignore[no-any-return]

    return CommandRunner(command, rate_regex, unit, sample_power)


def sweep_cmd(
    limits: str | None = typer.Option(
        None, "--limits", help="Watts: 700,650,...,350, a list, or CURRENT (set nothing)."
    ),
    gpus: str | None = GpusOption,
    workload: str = typer.Option(
        "matmul-bf16", "--workload", help="matmul-bf16, hbm (PyTorch on real GPUs) or a COMMAND."
    ),
    rate_regex: str | None = typer.Option(
        None, "--rate-regex", help="Regex whose first group is the rate a COMMAND prints."
    ),
    unit: str = typer.Option("units/s", "--unit", help="Unit of a COMMAND's rate."),
    seconds: float = typer.Option(30.0, "--seconds", min=0.1, help="Measured seconds per limit."),
    max_slowdown: str = typer.Option("5%", "--max-slowdown", help="Slowdown budget, e.g. 5%."),
    clocks: str | None = typer.Option(
        None,
        "--clocks",
        help="Also sweep locked SM clocks, MHz: 1980,1830,...,990, a list, or auto; "
        "then name the knob that saves more.",
    ),
    clock_state: Path | None = typer.Option(
        None, "--clock-state", help="Locked-clock record (default ~/.local/state/gpufleet)."
    ),
    html: Path | None = typer.Option(None, "--html", help="Write an HTML report here."),
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
) -> None:
    """Run a workload at each power limit (and locked clock); print the curves and the
    recommended setting."""
    from gpufleet.cli import power_clocks
    from gpufleet.energy import report
    from gpufleet.energy.advise import advise, parse_slowdown
    from gpufleet.energy.sweep import parse_limits, sweep

    if limits is None and clocks is None:
        raise UsageError("--limits: give power limits (e.g. 700,650,...,350) and/or --clocks")
    wanted = parse_limits(limits) if limits is not None else None
    budget = parse_slowdown(max_slowdown)
    backend, node, clock = _open(sim, seed)
    chosen = _gpus(gpus, backend)
    runner = _runner(workload, rate_regex, unit, backend, node, clock)
    planned = None
    if clocks is not None:  # checked (and leftovers reset) before anything is swept
        planned = power_clocks.plan(backend, chosen, clocks, clock_state, as_json)
    if planned is None and limits is None:  # pragma: no cover - refused above
        raise UsageError("--clocks: nothing to sweep")
    if limits is None and planned is not None:
        only = power_clocks.clock_sweep(backend, chosen, planned, runner, seconds, budget, as_json)
        doc: dict[str, Any] = {"workload": workload, "unit": runner.unit, "gpus": chosen}
        power_clocks.add_to_doc(doc, None, only, budget, node is not None)
        if html is not None:
            page = report.to_html(
                None, None, workload, clocks=only, max_slowdown=budget, modelled=node is not None
            )
            _write_html(html, page)
        if as_json:
            emit_json(doc)
        else:
            power_clocks.print_clocks(workload, chosen, None, only, budget, node is not None)
        return
    steps = 1 if wanted is None else len(wanted)
    with Progress(console=err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task("sweeping", total=steps)

        def progress(done: int, total: int, limit: float | None) -> None:
            label = "current limit" if limit is None else f"{limit:g} W"
            bar.update(task, completed=done, description=label if done < total else "done")

        result = sweep(backend, chosen, wanted, runner, seconds, progress=progress)
    advice = advise(result, budget)
    clock_run = None
    if planned is not None:
        clock_run = power_clocks.clock_sweep(
            backend, chosen, planned, runner, seconds, budget, as_json
        )
    doc = report.to_json(result, advice, workload)
    power_clocks.add_to_doc(doc, advice, clock_run, budget, node is not None)
    if html is not None:
        modelled = node is not None
        page = report.to_html(
            result, advice, workload, clocks=clock_run, max_slowdown=budget, modelled=modelled
        )
        _write_html(html, page)
    if as_json:
        emit_json(doc)
        return
    tag = " (modelled)" if node is not None else ""
    table = Table(title=f"power sweep{tag}: {workload} on GPU(s) {','.join(map(str, chosen))}")
    for col in ("limit W", result.unit, "power W", f"{result.unit}/W", "energy"):
        table.add_column(col, justify="right")
    for p in doc["points"]:
        table.add_row(
            "current" if p["limit_w"] is None else f"{p['limit_w']:g}",
            f"{p['throughput']:.1f}",
            "N/A" if p["power_w"] is None else f"{p['power_w']:.0f}",
            "N/A" if p["throughput_per_w"] is None else f"{p['throughput_per_w']:.3f}",
            p["energy_method"] or "N/A",
        )
    console.print(fit(table))
    rec = doc["recommendation"]
    if rec is None:
        console.print("no recommendation: energy unknown (no counter, no power readings)")
    else:
        saved = rec["energy_saved"]
        console.print(
            f"recommended: {rec['limit_w']:g} W (slowdown {rec['slowdown']:.1%} within "
            f"{budget:.0%}; energy per unit of work {'-' if saved is None else f'{saved:.1%}'} "
            f"vs {rec['baseline_limit_w']:g} W); energy-delay optimum: {rec['edp_limit_w']:g} W"
        )
    if result.restored and wanted is not None:
        console.print("original limits restored")
    if clock_run is not None:
        power_clocks.print_clocks(workload, chosen, advice, clock_run, budget, node is not None)


def _write_html(path: Path, page: str) -> None:
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc


StateOption = typer.Option(None, "--state", help="State file (default ~/.local/state/gpufleet).")


ControllerOpt = typer.Option(
    None, "--controller", help="Control-plane URL: apply across the fleet.", metavar="URL"
)


def fleet_remote(
    controller: str | None = ControllerOpt,
    token: str | None = BearerTokenOption,
    token_file: Path | None = TokenFileOption,
) -> Remote:
    """`power apply` and `restore`: with ``--controller``, on the fleet's nodes (else here)."""
    return Remote(controller, token, token_file)


@option_groups(remote=fleet_remote)
def apply_cmd(
    limit: float | None = typer.Option(None, "--limit", help="Watts to set."),
    recommended: Path | None = typer.Option(
        None, "--recommended", help="A `power sweep --json` file: set its recommendation."
    ),
    gpus: str | None = GpusOption,
    dry_run: bool = DryRunOption,
    *,
    remote: Remote,
    tenant: str | None = typer.Option(None, "--tenant", help="Fleet: the tenant's nodes."),
    partition: str | None = typer.Option(
        None, "--partition", help="Fleet: nodes labelled partition=P."
    ),
    label: list[str] = typer.Option([], "--label", help="Fleet: nodes with label k=v (repeat)."),
    nodes: str | None = typer.Option(None, "--nodes", help="Fleet: node names n1,n2."),
    revert_after: str | None = typer.Option(
        None, "--revert-after", help="Fleet: put the limits back after 8h, 30m, 90s..."
    ),
    state: Path | None = StateOption,
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
) -> None:
    """Set a power limit through NVML (the previous one is kept for `power restore`); with
    --controller, on the selected nodes through their agents."""
    from gpufleet.energy.apply import apply_limit, default_state_file, recommended_limit

    if (limit is None) == (recommended is None):
        raise UsageError("give exactly one of --limit W, --recommended FILE")
    watts = float(limit) if limit is not None else recommended_limit(recommended)  # type: ignore[arg-type]
    fleet_only = tenant or partition or label or nodes or revert_after
    if remote.controller is not None:
        from gpufleet.cli.power_fleet import apply_fleet

        apply_fleet(
            remote,
            watts=watts,
            gpus=gpus,
            tenant=tenant,
            partition=partition,
            labels=label,
            nodes=nodes,
            revert_after=revert_after,
            dry_run=dry_run,
            as_json=as_json,
        )
        return
    if fleet_only:
        raise UsageError(
            "--tenant, --partition, --label, --nodes and --revert-after need --controller"
        )
    backend, _node, _clock = _open(sim, seed)
    rows = apply_limit(
        backend, _gpus(gpus, backend), watts, state or default_state_file(), dry_run=dry_run
    )
    _print_rows(rows, "would set" if dry_run else "set", as_json, dry_run)


@option_groups(remote=fleet_remote)
def restore_cmd(
    order: int | None = typer.Argument(
        None, help="With --controller: the power order to put back.", metavar="ORDER"
    ),
    dry_run: bool = DryRunOption,
    *,
    remote: Remote,
    state: Path | None = StateOption,
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
) -> None:
    """Put back the power limits `power apply` replaced (with --controller: an order's)."""
    from gpufleet.energy.apply import default_state_file, restore

    if remote.controller is not None:
        from gpufleet.cli.power_fleet import restore_fleet

        if order is None:
            raise UsageError("power restore --controller needs the ORDER id")
        if dry_run:
            raise UsageError("--dry-run is for this machine's GPUs; see `power status ORDER`")
        restore_fleet(remote, order, as_json)
        return
    if order is not None:
        raise UsageError("an ORDER id needs --controller URL")
    backend, _node, _clock = _open(sim, seed)
    rows = restore(backend, state or default_state_file(), dry_run=dry_run)
    _print_rows(rows, "would restore" if dry_run else "restored", as_json, dry_run)


def _print_rows(rows: list[dict[str, Any]], verb: str, as_json: bool, dry_run: bool) -> None:
    if as_json:
        emit_json({"dry_run": dry_run, "gpus": rows})
        return
    for r in rows:
        was = "N/A" if r["from_w"] is None else f"{r['from_w']:g} W"
        console.print(f"{r['node']} GPU {r['gpu']}: {verb} {r['to_w']:g} W (was {was})")


def rack_cmd(
    system: str = typer.Option(..., "--system", help="A catalog system, e.g. dgx-h100."),
    rack_kw: float = typer.Option(..., "--rack-kw", help="Rack power budget (kW)."),
    cap: float = typer.Option(..., "--cap", help="Per-GPU power limit (W)."),
    workload: str = typer.Option("matmul-bf16", "--workload", help="matmul-bf16 or hbm."),
    as_json: bool = JsonOption,
) -> None:
    """Power-capped rack scenario: servers per rack and throughput under a per-GPU cap."""
    from dataclasses import asdict

    from gpufleet.plan.powercap import capped_scenario

    s = capped_scenario(system, rack_kw, cap, workload)
    if as_json:
        emit_json(asdict(s))
        return
    console.print(s.sentence())


def register(app: typer.Typer) -> None:
    """Attach `gpufleet power`."""
    power_app.command("sweep")(sweep_cmd)
    power_app.command("apply")(apply_cmd)
    power_app.command("restore")(restore_cmd)
    power_app.command("rack")(rack_cmd)
    from gpufleet.cli.power_fleet import budget_cmd, status_cmd

    power_app.command("status")(status_cmd)
    power_app.command("budget")(budget_cmd)
    app.add_typer(power_app, name="power")
