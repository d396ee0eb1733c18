"""`gpufleet status`: a live per-GPU table like nvidia-smi's, with throttle reasons in words."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from gpufleet.cli.common import ImportOption, JsonOption, SeedOption, SimOption, paths
from gpufleet.cli.output import console, emit_json, fit, fmt, to_jsonable
from gpufleet.devices.discovery import Fleet, open_fleet, read_each
from gpufleet.devices.types import DeviceInfo, Sample, decode_clock_reasons
from gpufleet.facade import GpuReading, sample


def _ecc(s: Sample) -> str:
    if s.ecc_sbe_volatile is None and s.ecc_dbe_volatile is None:
        return "N/A"
    text = f"{fmt(s.ecc_sbe_volatile)}/{fmt(s.ecc_dbe_volatile)}"
    return f"[red]{text}[/]" if (s.ecc_dbe_volatile or 0) > 0 else text


def _remap(s: Sample) -> str:
    if s.remap_failure:
        return "[red]FAILED[/]"
    if s.remap_pending:
        return "[yellow]pending[/]"
    if s.remapped_rows_uncorrectable is None:
        return "N/A"
    return f"ok {s.remapped_rows_correctable or 0}/{s.remapped_rows_uncorrectable}"


def render(rows: list[GpuReading]) -> Table:
    table = Table(
        title=f"{len(rows)} GPU(s) at {time.strftime('%H:%M:%S')}",
        caption="GiB used/total, temp GPU/memory C, W draw/limit, MHz SM/memory, "
        "ECC volatile single/double-bit, remap correctable/uncorrectable rows",
    )
    table.add_column("node", no_wrap=True)
    for col in ("gpu", "model", "util", "GiB", "temp", "W", "MHz", "clock reasons", "ECC", "remap"):
        # Figures never wrap ("35/38" split over two lines reads as 35/3 and 8); words may.
        wraps = col in ("clock reasons", "remap")
        table.add_column(col, overflow="fold" if wraps else "ellipsis", no_wrap=not wraps)
    for r in rows:
        model = (r.info.model or r.info.name) if r.info else "?"
        if r.sample is None:
            # The message goes to the one wrapping column; "util" just says what happened.
            lost = "lost" in (r.error or "").lower()
            flag = "[bold red]lost[/]" if lost else "[bold red]error[/]"
            message = f"[red]{r.error or 'no data'}[/]"
            table.add_row(r.node, str(r.index), model, flag, *[""] * 4, message, "", "")
            continue
        s = r.sample
        mem = "N/A"
        if s.mem_used_bytes is not None and r.info and r.info.memory_total_bytes:
            mem = f"{s.mem_used_bytes / 2**30:.1f}/{r.info.memory_total_bytes / 2**30:.0f}"
        limit = r.info.power_limit_enforced_w if r.info else None
        reasons = ", ".join(decode_clock_reasons(s.clock_event_reasons)) or "none"
        if s.clock_event_reasons and s.clock_event_reasons & 0xE8:  # HW slowdown/thermal/brake
            reasons = f"[red]{reasons}[/]"
        table.add_row(
            r.node,
            str(r.index),
            model,
            fmt(s.gpu_util_pct, "%"),
            mem,
            f"{fmt(s.gpu_temp_c)}" + (f"/{fmt(s.mem_temp_c)}" if s.mem_temp_c is not None else ""),
            f"{fmt(s.power_w)}/{fmt(limit)}",
            f"{fmt(s.sm_clock_mhz)}/{fmt(s.mem_clock_mhz)}",
            reasons,
            _ecc(s),
            _remap(s),
        )
    return fit(table)


def status_document(rows: list[GpuReading]) -> dict[str, Any]:
    """The JSON shape of ``gpufleet status --json``."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        entry: dict[str, Any] = {
            "index": r.index,
            "uuid": r.info.uuid if r.info else None,
            "model": r.info.model if r.info else None,
            "power_limit_w": r.info.power_limit_enforced_w if r.info else None,
            "lost": r.sample is None,
            "error": r.error,
        }
        if r.sample is not None:
            entry.update(to_jsonable(r.sample))
            entry["clock_event_reasons_words"] = decode_clock_reasons(r.sample.clock_event_reasons)
        nodes.setdefault(r.node, []).append(entry)
    return {"nodes": [{"name": n, "gpus": g} for n, g in nodes.items()]}


def _read_identities(fleet: Fleet, infos: dict[tuple[str, int], DeviceInfo]) -> None:
    """Every GPU's identity, all GPUs of a node at once within one NVML deadline: a hung GPU
    costs one deadline, and later calls on it fail at once (its row says it did not answer)."""
    for backend in fleet.backends:
        for i, value in read_each(backend, "device_info", range(backend.device_count())).items():
            if isinstance(value, DeviceInfo):
                infos[(backend.node_name, i)] = value


def status(
    sim: str | None = SimOption,
    seed: int = SeedOption,
    busy: bool = typer.Option(
        False, "--busy", help="With --sim: every GPU busy with one of a seeded mix of loads."
    ),
    watch: bool = typer.Option(
        False,
        "--watch",
        "-w",
        help="Refresh until Ctrl-C (with --json: one JSON document per line per refresh).",
    ),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between refreshes."),
    count: int = typer.Option(0, "--count", min=0, help="With --watch: stop after N refreshes."),
    imports: list[Path] | None = ImportOption,
    as_json: bool = JsonOption,
) -> None:
    """Per-GPU utilization, memory, temperature, power, clocks, throttle reasons, ECC, remaps.

    With --import: the readings of captured nvidia-smi reports (-q -x or -q), judged offline.
    """
    fleet = open_fleet(sim=sim, imports=paths(imports), seed=seed).bounded()
    if fleet.import_result is not None:
        _status_import(fleet, as_json)
        return
    if busy and fleet.sim is not None:
        fleet.sim.demo_activity(busy_fraction=1.0)  # --busy means busy: no idle node
    infos: dict[tuple[str, int], DeviceInfo] = {}
    try:
        _read_identities(fleet, infos)
        if not watch:
            rows = sample(fleet, infos)
            if as_json:
                emit_json(status_document(rows))
            else:
                console.print(render(rows))
            return
        n = 0
        if as_json:  # JSON Lines: no live table on stdout, one compact document per refresh
            while True:
                emit_json(status_document(sample(fleet, infos)), line=True)
                n += 1
                if count and n >= count:
                    break
                time.sleep(interval)
            return
        with Live(render(sample(fleet, infos)), console=console, refresh_per_second=4) as live:
            while True:
                n += 1
                if count and n >= count:
                    break
                time.sleep(interval)
                live.update(render(sample(fleet, infos)))
    except KeyboardInterrupt:
        pass
    finally:
        fleet.close()


def _status_import(fleet: Fleet, as_json: bool) -> None:
    """One table (or document) of the imported reports' readings; GPUs and files that could
    not be read are listed under it (``import.failed`` in JSON) and the command exits 1."""
    result = fleet.import_result
    rows = sample(fleet, {})
    if as_json:
        doc = status_document(rows)
        doc["import"] = {"failed": result.failed, "warnings": result.warnings}
        emit_json(doc)
    else:
        console.print(render(rows))
        for w in result.warnings:
            console.print(f"[yellow]warning:[/] {w}", highlight=False)
        for f in result.failed:
            console.print(f"[red]not imported:[/] {f}", highlight=False)
    if result.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet status`."""
    app.command("status")(status)
