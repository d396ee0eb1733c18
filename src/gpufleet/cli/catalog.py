"""`gpufleet catalog`: browse the packaged hardware catalog (GPUs, systems, MIG, XID codes)."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.table import Table

from gpufleet.catalog import GpuModel, MigGeometry, XidEntry, load_catalog
from gpufleet.cli.output import console, emit_json, fit, fmt, print_error
from gpufleet.errors import GpufleetError, UnknownNameError, UsageError

catalog_app = typer.Typer(
    name="catalog",
    help="Browse the hardware catalog: GPU models, systems, MIG geometries, XID codes.",
    no_args_is_help=True,
)

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")

# Figures shown by `catalog gpu KEY`, in display order, with their units.
_GPU_FIGURES: tuple[tuple[str, str], ...] = (
    ("marketing_name", ""),
    ("vendor", ""),
    ("nvml_names", ""),
    ("pci_device_ids", ""),
    ("architecture", ""),
    ("compute_capability", ""),
    ("form_factor", ""),
    ("memory_bytes", " B"),
    ("memory_type", ""),
    ("memory_bandwidth_gbps", " GB/s"),
    ("tflops", " TFLOP/s"),
    ("max_power_w", " W"),
    ("power_limit_min_w", " W"),
    ("power_limit_max_w", " W"),
    ("idle_power_w", " W"),
    ("gpu_link", ""),
    ("nvlink_generation", ""),
    ("gpu_link_bandwidth_gbps", " GB/s"),
    ("pcie_generation", ""),
    ("pcie_lanes", ""),
    ("mig_max_instances", ""),
    ("sm_count", ""),
    ("base_sm_clock_mhz", " MHz"),
    ("max_sm_clock_mhz", " MHz"),
    ("max_mem_clock_mhz", " MHz"),
    ("slowdown_temp_c", " C"),
    ("shutdown_temp_c", " C"),
    ("max_operating_temp_c", " C"),
)


def _fail(exc: GpufleetError) -> NoReturn:
    """Print a gpufleet error as one line, as ``main()`` does, and exit with its code.

    Exiting here (rather than raising) keeps the exit code under Typer's standalone runner too.
    """
    print_error(exc.message, exc.hint)
    raise typer.Exit(exc.exit_code)


def _link(g: GpuModel) -> str:
    if g.gpu_link.value == "none":
        return "none"
    name = {"nvlink": "NVLink", "bridge": "NVLink bridge", "infinity_fabric": "Infinity Fabric"}[
        g.gpu_link.value
    ]
    gen = f"{g.nvlink_generation}" if g.nvlink_generation and g.gpu_link.value == "nvlink" else ""
    bw = f" {g.gpu_link_bandwidth_gbps:g} GB/s" if g.gpu_link_bandwidth_gbps else ""
    return f"{name}{gen}{bw}"


def _gpu_row(g: GpuModel) -> dict[str, Any]:
    return {
        "key": g.key,
        "name": g.marketing_name,
        "memory_bytes": g.memory_bytes,
        "memory_type": g.memory_type,
        "memory_bandwidth_gbps": g.memory_bandwidth_gbps,
        "bf16_tflops": g.tflops.bf16,
        "fp8_tflops": g.tflops.fp8,
        "max_power_w": g.max_power_w,
        "gpu_link": g.gpu_link.value,
        "gpu_link_bandwidth_gbps": g.gpu_link_bandwidth_gbps,
        "mig_max_instances": g.mig_max_instances,
    }


@catalog_app.command("gpus")
def gpus(json_out: bool = JSON_OPTION) -> None:
    """List GPU models: memory, bandwidth, dense BF16/FP8 TFLOP/s, power, GPU link."""
    cat = load_catalog()
    models = sorted(cat.gpus.values(), key=lambda g: g.key)
    if json_out:
        emit_json({"gpus": [_gpu_row(g) for g in models]})
        return
    table = Table(title="GPU models (dense TFLOP/s)")
    for col in ("key", "name", "memory", "BW GB/s", "BF16", "FP8", "W", "link"):
        table.add_column(
            col,
            justify="right" if col in ("BW GB/s", "BF16", "FP8", "W") else "left",
            no_wrap=col not in ("name", "memory", "link"),  # the key is what you type next
        )
    for g in models:
        table.add_row(
            g.key,
            g.marketing_name,
            f"{g.memory_gib:.1f} GiB {g.memory_type}",
            fmt(g.memory_bandwidth_gbps, digits=0),
            fmt(g.tflops.bf16, digits=1),
            fmt(g.tflops.fp8, digits=1),
            fmt(g.max_power_w, digits=0),
            _link(g),
        )
    console.print(fit(table))


def _figures(g: GpuModel) -> list[dict[str, Any]]:
    """Every figure of a model that has a value, each with the source it comes from."""
    out: list[dict[str, Any]] = []
    for field, unit in _GPU_FIGURES:
        if field == "tflops":
            for prec, value in g.tflops.model_dump().items():
                if value is not None:
                    src = g.sources.get(f"tflops.{prec}", g.source_of("tflops"))
                    out.append(
                        {
                            "field": f"tflops.{prec}",
                            "value": value,
                            "unit": unit.strip(),
                            "source": src,
                        }
                    )
            continue
        value = getattr(g, field)
        if value is None or value == ():
            continue
        if hasattr(value, "value"):  # enums
            value = value.value
        out.append(
            {
                "field": field,
                "value": list(value) if isinstance(value, tuple) else value,
                "unit": unit.strip(),
                "source": g.source_of(field),
            }
        )
    return out


@catalog_app.command("gpu")
def gpu(
    name: str = typer.Argument(..., help="Model key, alias, marketing or NVML name."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show every figure of one GPU model with its source."""
    cat = load_catalog()
    try:
        g = cat.gpu(name)
    except UnknownNameError as exc:
        _fail(exc)
    figures = _figures(g)
    if json_out:
        emit_json(
            {
                "key": g.key,
                "aliases": list(g.aliases),
                "figures": figures,
                "efficiency": g.efficiency.model_dump() if g.efficiency else None,
                "source": g.source,
            }
        )
        return
    table = Table(title=f"{g.key}: {g.marketing_name}")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("source", overflow="fold")
    for f in figures:
        value = f["value"]
        text = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        unit = f" {f['unit']}" if f["unit"] else ""
        table.add_row(f["field"], f"{text}{unit}", f["source"])
    if g.efficiency:
        for prec, value in g.efficiency.tflops.items():
            table.add_row(f"measured {prec}", f"{value:g} TFLOP/s", g.efficiency.source)
    console.print(fit(table))


@catalog_app.command("systems")
def systems(json_out: bool = JSON_OPTION) -> None:
    """List systems (DGX/HGX class servers)."""
    cat = load_catalog()
    items = sorted(cat.systems.values(), key=lambda s: s.key)
    if json_out:
        emit_json({"systems": [s.model_dump(mode="json") for s in items]})
        return
    table = Table(title="Systems")
    for col in ("key", "name", "GPUs", "max kW", "U", "compute NICs", "storage NICs", "source"):
        table.add_column(col, overflow="fold", no_wrap=col in ("key", "max kW", "U"))
    for s in items:
        table.add_row(
            s.key,
            s.name,
            f"{s.gpus}x {s.gpu}",
            f"{s.max_power_kw:g}",
            str(s.rack_units),
            f"{s.compute_nics}x {s.compute_nic_gbps}G",
            f"{s.storage_nics}x {s.storage_nic_gbps}G" if s.storage_nics else "-",
            s.source,
        )
    console.print(fit(table))


def _geometry(name: str) -> tuple[GpuModel, MigGeometry]:
    cat = load_catalog()
    model = cat.gpu(name)
    geom = cat.mig_geometry(model.key)
    if geom is None:
        with_mig = sorted(cat.mig)
        raise UsageError(
            f"no MIG geometry in the catalog for {model.key!r}"
            + (" (the GPU does not support MIG)" if model.mig_max_instances == 0 else ""),
            hint=f"models with MIG geometries: {', '.join(with_mig)}",
        )
    return model, geom


@catalog_app.command("mig")
def mig(
    model: str = typer.Argument(..., help="GPU model key, alias or NVML name."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show a model's MIG GPU-instance profiles and their valid placements."""
    try:
        gpu_model, geom = _geometry(model)
    except GpufleetError as exc:
        _fail(exc)
    if json_out:
        emit_json(geom.model_dump(mode="json"))
        return
    table = Table(title=f"MIG profiles: {gpu_model.key} ({geom.memory_slices} memory slices)")
    cols = ("profile", "id", "SM share", "memory slices", "MiB", "SMs", "max", "placements")
    for col in (*cols, "CE", "DEC", "ENC", "JPG", "OFA"):
        table.add_column(col, no_wrap=col in ("profile", "MiB", "placements"))
    for p in geom.profiles:
        starts = ",".join(str(s) for s in p.placements)
        table.add_row(
            p.name,
            _known(p.profile_id),
            f"{p.compute_slices}/{geom.compute_slices}",
            f"{p.memory_slices}/{geom.memory_slices}",
            _known(p.memory_mib),
            _known(p.sm_count),
            str(p.max_instances),
            f"{{{starts}}}:{p.placement_size}",
            *(_known(v) for v in (p.copy_engines, p.decoders, p.encoders, p.jpeg, p.ofa)),
        )
    console.print(fit(table))
    if any(p.media_extensions for p in geom.profiles):
        console.print(
            "+me: holds the media extensions; at most one +me instance per GPU", highlight=False
        )
    console.print("-: no source gives this figure", highlight=False)
    console.print(f"source: {geom.source}", highlight=False)
    for aspect, text in geom.sources.items():
        console.print(f"source ({aspect}): {text}", highlight=False)


def _known(value: int | None) -> str:
    """A figure for a table cell; ``-`` where the catalog has none (never a made-up 0)."""
    return "-" if value is None else str(value)


def _xid_row(x: XidEntry) -> dict[str, Any]:
    return x.model_dump(mode="json")


@catalog_app.command("xid")
def xid(
    code: int | None = typer.Argument(None, help="One XID code; all when omitted."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show the XID catalog: meaning, severity and immediate action per code."""
    cat = load_catalog()
    if code is None:
        entries = [cat.xids[c] for c in sorted(cat.xids)]
    else:
        entry = cat.xid(code)
        if entry is None:
            _fail(UnknownNameError("XID code", str(code), [str(c) for c in sorted(cat.xids)]))
        entries = [entry]
    if json_out:
        rows = [_xid_row(x) for x in entries]
        emit_json(rows[0] if code is not None else {"xids": rows})
        return
    table = Table(title="XID codes" if code is None else f"XID {code}")
    for col in ("code", "name", "severity", "action", "app", "meaning / notes"):
        table.add_column(col, overflow="fold", no_wrap=col in ("code", "severity", "action"))
    for x in entries:
        table.add_row(
            str(x.code),
            x.name,
            x.severity.value,
            x.action.value,
            "yes" if x.application_level else "",
            x.meaning if code is None else f"{x.meaning}\n{x.notes}\nsource: {x.source}",
        )
    console.print(fit(table))


def register(app: typer.Typer) -> None:
    """Attach `gpufleet catalog ...` to the app."""
    app.add_typer(catalog_app, name="catalog")
