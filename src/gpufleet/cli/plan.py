"""`gpufleet plan`: size a GPU fleet from a YAML spec (terminal summary, JSON, BOM CSV, HTML)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.output import console, emit_json, fmt
from gpufleet.errors import ConfigError, UnknownNameError, UsageError

EXAMPLE = "training-1024.yaml"


def _rate(bytes_per_s: float) -> str:
    """A data rate with a unit that keeps two significant figures visible."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _money(v: float | None) -> str:
    if v is None:
        return "N/A"
    return f"${v / 1e6:,.2f}M" if abs(v) >= 1e6 else f"${v:,.0f}"


def _summary(result: object, compare: bool) -> None:
    from gpufleet.plan.planner import CandidatePlan, Plan

    assert isinstance(result, Plan)
    best = result.best
    assert best is not None and best.facility and best.fabric and best.cost and best.storage
    console.print(
        f"[bold]{result.name}[/]: chosen [bold green]{best.candidate}[/] ({best.server.name})"
    )
    t = Table(title="Plan", show_header=False)
    f, fab, c, s = best.facility, best.fabric, best.cost, best.storage
    for w in best.workloads:
        detail = f"{w.gpus} GPUs"
        if w.training:
            m = w.training.memory
            detail += (
                f", tp {m.tensor_parallel} pp {m.pipeline_parallel} dp {m.data_parallel}, "
                f"{m.total_bytes / 1e9:.1f} GB/GPU, {w.training.days:.1f} days "
                f"({w.training.days_range[0]:.1f}-{w.training.days_range[1]:.1f})"
            )
        if w.inference:
            detail += (
                f", {w.inference.replicas} x {w.inference.gpus_per_replica}-GPU replicas, "
                f"{w.inference.decode_tokens_per_s:,.0f} tok/s ({w.inference.decode_bound})"
            )
        if w.hpc:
            h = w.hpc
            detail += (
                f", {h.precision} ({h.peak_path} {h.peak_tflops:g} TFLOP/s x {h.efficiency:.0%})"
                f" = {h.sustained_tflops:,.0f} TFLOP/s sustained, bound by {h.bound}"
            )
        t.add_row(f"workload {w.name}", detail)
    t.add_row("GPUs / servers", f"{best.gpus} / {best.servers}")
    t.add_row(
        "racks",
        f"{f.racks} ({f.servers_per_rack}/rack, {f.rack_load_kw:.1f} kW, "
        f"limited by {f.servers_per_rack_limited_by})",
    )
    t.add_row(
        "power",
        f"IT {f.it_kw:,.0f} kW, facility {f.facility_kw:,.0f} kW (PUE {f.pue}), "
        f"{f.annual_mwh:,.0f} MWh/yr",
    )
    t.add_row(
        "circuits",
        f"{f.circuits_per_rack}/rack x {f.circuit_kw:.1f} kW ({f.redundancy}), {f.pdus} PDUs",
    )
    t.add_row(
        "cooling", f"{f.heat_load_kw:,.0f} kW = {f.heat_load_tons:,.0f} tons ({f.cooling} cooled)"
    )
    t.add_row(
        "rack weight",
        "not known (see the notes)"
        if f.rack_weight_kg is None or f.floor_load_kg_m2 is None
        else f"{f.rack_weight_kg:,.0f} kg per full rack, floor {f.floor_load_kg_m2:,.0f} kg/m^2 "
        f"over {f.rack_footprint_m2:.2f} m^2 (rating {f.floor_rating_kg_m2:,.0f} kg/m^2)",
    )
    if best.plant:
        pl = best.plant
        t.add_row(
            "UPS / generators",
            f"{pl.ups_systems} x {pl.ups_kva:,.0f} kVA, {pl.ups_runtime_s / 60:g} min "
            f"({pl.battery_kwh:,.1f} kWh, {pl.ups_battery}); {pl.generators} x "
            f"{pl.generator_unit_kw:,.0f} kW gensets for {pl.generator_kva:,.0f} kVA "
            f"({pl.generator_unit_basis}, at most {pl.generator_loading:.0%} loaded)",
        )
        if pl.cdus:
            t.add_row(
                "liquid plant",
                f"{pl.liquid_kw:,.0f} kW to liquid: {pl.cdus} CDUs (N+1), "
                f"{pl.coolant_l_per_min:,.0f} L/min ({pl.coolant_l_per_min_per_kw:.2f} L/min/kW)",
            )
        t.add_row("air", f"{pl.air_kw:,.0f} kW: {pl.airflow_m3_per_h:,.0f} m3/h")
    ct = fab.compute
    t.add_row(
        "compute fabric",
        f"none: {fab.compute_reason or 'one node (NVLink/PCIe inside the server)'}"
        if ct.levels == 0
        else f"{ct.levels}-level, {ct.leaves} leaf, {ct.spines} spine, "
        f"{ct.cores} core; {ct.endpoint_links} + {ct.leaf_spine_links} + "
        f"{ct.spine_core_links} links"
        + (f" ({ct.management_links} of them UFM)" if ct.management_links else ""),
    )
    if ct.levels and fab.compute_reason:
        t.add_row("fabric need", fab.compute_reason)
    if fab.management_reason:
        t.add_row("management", fab.management_reason)
    if ct.spine_reason:
        t.add_row("spines", ct.spine_reason)
    t.add_row("optics", f"{fab.transceivers:,} transceivers")
    if s.checkpoint_bytes:
        t.add_row(
            "storage",
            f"checkpoint {s.checkpoint_bytes / 1e12:.2f} TB, write "
            f"{s.checkpoint_write_bytes_per_s / 1e9:.1f} GB/s, dataset read "
            f"{_rate(s.dataset_read_bytes_per_s)}",
        )
    if s.hpc_read_bytes_per_s is not None:
        t.add_row("HPC input read", f"{_rate(s.hpc_read_bytes_per_s)} from shared storage")
    t.add_row(
        "shared storage",
        ("parallel file system " if s.parallel_fs_recommended else "no parallel FS ")
        + f"({s.reason})"
        + (f", {s.capacity_bytes / 1e12:,.0f} TB" if s.parallel_fs_recommended else ""),
    )
    t.add_row("capex / opex", f"{_money(c.capex)} / {_money(c.opex_per_year)} per year")
    if c.staff_per_year:
        t.add_row("staff", f"{_money(c.staff_per_year)} per year")
    if c.depreciation_per_year is not None:
        t.add_row(
            "depreciation",
            f"{_money(c.depreciation_per_year)} per year over {c.depreciation_years:g} y, "
            f"{c.purchases} purchase(s), residual {_money(c.residual_value)} at the horizon",
        )
    if best.cost_per_million_tokens is not None:
        t.add_row(
            "inference",
            f"{best.cost_per_million_tokens:,.3f} $/M tokens, "
            f"{fmt(best.tokens_per_joule, ' tokens/J', 3)}",
        )
    t.add_row(
        f"TCO {c.horizon_years:g} y",
        f"{_money(c.tco)}, {fmt(c.cost_per_gpu_hour, ' $/GPU-h', 2)} at {c.utilization:.0%}",
    )
    t.add_row(
        "vs cloud",
        "N/A"
        if c.cloud_per_gpu_hour is None
        else f"owning wins from month {c.breakeven_month}"
        if c.breakeven_month
        else "never",
    )
    console.print(t)
    if compare:
        ct2 = Table(title="Candidates")
        cols = (
            "candidate",
            "GPUs",
            "servers",
            "days",
            "MWh",
            "TCO",
            "tokens/J",
            "$/M tok",
            "status",
        )
        for col in cols:
            ct2.add_column(col)
        for cp in result.candidates:
            assert isinstance(cp, CandidatePlan)
            ct2.add_row(
                cp.candidate,
                str(cp.gpus),
                str(cp.servers),
                fmt(cp.training_days, digits=1),
                fmt(cp.run_energy_mwh, digits=0),
                _money(cp.cost.tco if cp.cost else None),
                fmt(cp.tokens_per_joule, digits=3),
                fmt(cp.cost_per_million_tokens, digits=3),
                "ok" if cp.feasible else f"infeasible: {cp.problem}",
            )
        console.print(ct2)
    for n in best.notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    for n in best.warnings:
        console.print(f"[bold red]warning:[/] {n}", highlight=False)


def plan_command(
    spec: Path | None = typer.Argument(None, help="Plan spec (YAML)."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole plan as JSON."),
    html: Path | None = typer.Option(None, "--html", help="Write a self-contained HTML report."),
    bom: Path | None = typer.Option(None, "--bom", help="Write the bill of materials as CSV."),
    cable_map: Path | None = typer.Option(
        None, "--cable-map", help="Write every cable (device/port to device/port) as CSV."
    ),
    compare: bool = typer.Option(False, "--compare", help="Show every candidate side by side."),
    example: bool = typer.Option(False, "--example", help="Print a commented example spec."),
) -> None:
    """Size GPUs, servers, racks, power, cooling, fabric, storage and cost from a YAML spec.

    Exits 1 when the plan carries a warning (capex over the budget), 2 on bad input.
    """
    if example:
        text = resources.files("gpufleet.plan").joinpath("examples", EXAMPLE).read_text("utf-8")
        if json_out:
            emit_json({"example": EXAMPLE, "spec": text})
        else:
            typer.echo(text, nl=False)
        return
    if spec is None:
        raise UsageError("give a spec file", hint="gpufleet plan --example > spec.yaml")
    from gpufleet.yamldoc import read_text_file

    text = read_text_file(spec, "spec")
    from gpufleet.plan.bom import bom_csv, bom_rows
    from gpufleet.plan.cablemap import cable_map as build_cable_map
    from gpufleet.plan.cablemap import cable_map_csv
    from gpufleet.plan.planner import plan
    from gpufleet.plan.report_html import render_html
    from gpufleet.plan.spec import load_spec

    parsed = load_spec(text, str(spec))
    try:
        result = plan(parsed)
    except UnknownNameError as exc:  # a candidate the catalog lacks: name the file too
        exc.message = f"{spec}: {exc.message}"
        exc.args = (exc.message,)
        raise
    best = result.best
    assert best is not None
    outputs: list[tuple[Path | None, Callable[[], str]]] = [
        (bom, lambda: bom_csv(bom_rows(best))),
        (html, lambda: render_html(result)),
        (cable_map, lambda: cable_map_csv(_cables(best, build_cable_map))),
    ]
    for target, content in outputs:
        if target is not None:
            try:
                target.write_text(content(), encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from exc
    if json_out:
        emit_json(result)
    else:
        _summary(result, compare)
        for label, target in (("BOM", bom), ("HTML report", html), ("cable map", cable_map)):
            if target is not None:
                console.print(f"{label} written to {target}")
    if result.warnings:
        raise typer.Exit(1)


def _cables(best: object, build: Callable[..., list[Any]]) -> list[Any]:
    from gpufleet.plan.planner import CandidatePlan

    assert isinstance(best, CandidatePlan) and best.fabric and best.layout and best.facility
    return build(best.fabric, best.layout, best.facility.pdus)


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the app."""
    app.command("plan")(plan_command)
