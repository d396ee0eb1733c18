"""`gpufleet inventory`: nodes and GPUs (model, driver, VBIOS, memory, PCIe, ECC, MIG,
persistence) and configuration drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.common import (
    ImportOption,
    JsonOption,
    SeedOption,
    SimOption,
    TokenFileOption,
    paths,
    read_token,
)
from gpufleet.cli.output import console, emit_json, fit, fmt, to_jsonable
from gpufleet.devices.discovery import collect, open_fleet
from gpufleet.devices.drift import DriftItem, find_drift
from gpufleet.devices.smi.importer import ImportResult
from gpufleet.devices.smi.report_view import attention, import_details
from gpufleet.devices.types import NodeInventory, decode_clock_reasons


def inventory_document(
    nodes: list[NodeInventory],
    drift: list[DriftItem],
    notes: list[str],
    imported: ImportResult | None = None,
) -> dict[str, Any]:
    """The JSON shape of ``gpufleet inventory --json``; imported GPUs also carry ``reading``,
    ``mig_devices``, ``clock_event_counters_us`` and ``attention`` (see ``import_details``)."""
    details = import_details(imported)
    doc: dict[str, Any] = {
        "nodes": [
            {
                "name": n.name,
                "source": n.source,
                "driver_version": n.driver_version,
                "cuda_driver_version": n.cuda_driver_version,
                "host": None if n.host is None else to_jsonable(n.host),
                "gpus": [{**to_jsonable(g), **details.get((n.name, g.index), {})} for g in n.gpus],
            }
            for n in nodes
        ],
        "gpu_count": sum(len(n.gpus) for n in nodes),
        "drift": [to_jsonable(d) for d in drift],
        "notes": notes,
    }
    if imported is not None:
        doc["import"] = {"failed": imported.failed, "warnings": imported.warnings}
    return doc


def _onoff(v: bool | None) -> str:
    return "N/A" if v is None else ("on" if v else "off")


def _print(nodes: list[NodeInventory], drift: list[DriftItem], notes: list[str]) -> None:
    table = Table(title=f"{len(nodes)} node(s), {sum(len(n.gpus) for n in nodes)} GPU(s)")
    for col in (
        "node",
        "gpu",
        "model",
        "driver",
        "VBIOS",
        "memory",
        "PCIe now/max",
        "ECC",
        "MIG",
        "persist",
    ):
        table.add_column(col, no_wrap=col in ("node", "gpu", "memory"), overflow="fold")
    for n in nodes:
        for g in n.gpus:
            mem = (
                None if g.memory_total_bytes is None else f"{g.memory_total_bytes / 2**30:.0f} GiB"
            )
            # "5x16/5x16": generation x lanes, current / max (compact for 80 columns)
            cur = f"{fmt(g.pcie_gen_current)}x{fmt(g.pcie_width_current)}"
            link = f"{cur}/{fmt(g.pcie_gen_max)}x{fmt(g.pcie_width_max)}"
            low = (g.pcie_gen_current or 0) < (g.pcie_gen_max or 0) or (
                g.pcie_width_current or 0
            ) < (g.pcie_width_max or 0)
            table.add_row(
                n.name,
                str(g.index),
                g.model or g.name,
                fmt(g.driver_version),
                fmt(g.vbios_version),
                fmt(mem),
                f"[yellow]{link}[/]" if low else link,
                _onoff(g.ecc_current),
                _onoff(g.mig_current),
                _onoff(g.persistence_mode),
            )
    console.print(fit(table))
    if drift:
        console.print(f"[bold yellow]drift ({len(drift)}):[/]")
        for d in drift:
            console.print(f"  - {d.message}", highlight=False)
    else:
        console.print("[green]no drift:[/] versions match and every PCIe link is at its max")
    for note in notes:
        console.print(f"[red]note:[/] {note}", highlight=False)


def inventory(
    sim: str | None = SimOption,
    seed: int = SeedOption,
    imports: list[Path] | None = ImportOption,
    as_json: bool = JsonOption,
    baseline: Path | None = typer.Option(
        None,
        "--baseline",
        help="List the nodes out of this baseline (YAML) and which field differs.",
        metavar="FILE",
    ),
    controller: str | None = typer.Option(
        None, "--controller", help="With --baseline: the controller's fleet.", metavar="URL"
    ),
    token: str | None = typer.Option(None, "--token", envvar="GPUFLEET_TOKEN", hidden=True),
    token_file: Path | None = TokenFileOption,
) -> None:
    """Nodes and GPUs, with driver/VBIOS/CUDA/InfoROM drift and PCIe links below max."""
    if baseline is not None:
        from gpufleet.cli import inventory_baseline

        code = inventory_baseline.run(
            baseline,
            sim=sim,
            imports=paths(imports),
            seed=seed,
            controller=controller,
            token=read_token(token, token_file),
            as_json=as_json,
        )
        raise typer.Exit(code)
    if controller is not None:
        from gpufleet.errors import UsageError

        raise UsageError("--controller is read with --baseline (`inventory --baseline FILE`)")
    fleet = open_fleet(sim=sim, imports=paths(imports), seed=seed).bounded()
    try:
        nodes, notes = collect(fleet)
    finally:
        fleet.close()
    drift = find_drift(nodes)
    imported: ImportResult | None = fleet.import_result
    if as_json:
        emit_json(inventory_document(nodes, drift, notes, imported))
    else:
        _print(nodes, drift, notes)
        if imported is not None:
            print_import(imported)
    if imported is not None and imported.failed:
        raise typer.Exit(1)  # partial import: what parsed is shown, what did not is listed


def print_import(result: ImportResult) -> None:
    """Imported reports: readings at capture time, MIG devices, attention, failures, warnings."""
    table = Table(
        title="readings in the report(s)",
        caption="W draw/limit, MHz SM now/max, temp GPU/memory C, slowdown/shutdown C",
    )
    for col in ("node", "gpu", "W", "MHz", "util", "temp", "limits", "clock reasons"):
        wraps = col == "clock reasons"
        table.add_column(col, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for node in result.nodes:
        for gpu in node.report.gpus:
            s, i = gpu.sample, gpu.info
            table.add_row(
                node.name,
                str(i.index),
                f"{fmt(s.power_w)}/{fmt(i.power_limit_enforced_w)}",
                f"{fmt(s.sm_clock_mhz)}/{fmt(i.max_sm_clock_mhz)}",
                fmt(s.gpu_util_pct, "%"),
                f"{fmt(s.gpu_temp_c)}/{fmt(s.mem_temp_c)}",
                f"{fmt(i.slowdown_temp_c)}/{fmt(i.shutdown_temp_c)}",
                ", ".join(decode_clock_reasons(s.clock_event_reasons)) or "none",
            )
    console.print(fit(table))
    for node in result.nodes:
        for gpu in node.report.gpus:
            where = f"{node.name}/{gpu.info.index}"
            counters = {k: v for k, v in gpu.clock_event_counters_us.items() if v}
            if counters:
                text = ", ".join(f"{k} {v / 1e6:.1f} s" for k, v in counters.items())
                console.print(f"{where}: clock-event time: {text}", highlight=False)
            for m in gpu.mig_devices:
                mem = (
                    "N/A" if m.memory_total_bytes is None else f"{m.memory_total_bytes / 2**30:.1f}"
                )
                place = "" if m.placement_start is None else f" at slice {m.placement_start}"
                console.print(
                    f"{where}: MIG {m.profile_name or '?'} GI {fmt(m.gpu_instance_id)} "
                    f"CI {fmt(m.compute_instance_id)}, {fmt(m.sm_count)} SMs, {mem} GiB{place}",
                    highlight=False,
                )
            for a in attention(gpu.info, gpu.sample):
                console.print(f"[yellow]{where}: {a}[/]", highlight=False)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    for f in result.failed:
        console.print(f"[red]not imported:[/] {f}", highlight=False)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet inventory`."""
    app.command("inventory")(inventory)
