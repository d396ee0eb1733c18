"""`gpufleet config slurm`: slurm.conf node/partition lines, gres.conf and topology.conf from a
plan (``gpufleet plan --json``) or an inventory (this host's GPUs, or ``--sim SPEC``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.common import JsonOption, SeedOption, SimOption
from gpufleet.cli.output import console, emit_json
from gpufleet.errors import ConfigError, UsageError


def _inventory_doc(sim: str | None, seed: int) -> dict[str, Any]:
    from gpufleet.cli.inventory import collect, inventory_document
    from gpufleet.cli.output import to_jsonable
    from gpufleet.devices.discovery import open_fleet

    fleet = open_fleet(sim=sim, seed=seed)
    try:
        nodes, notes = collect(fleet)
    finally:
        fleet.close()
    doc: dict[str, Any] = to_jsonable(inventory_document(nodes, [], notes))
    return doc


def config_slurm(
    plan: Path | None = typer.Option(None, "--plan", help="A plan from `gpufleet plan --json`."),
    inventory: bool = typer.Option(False, "--inventory", help="Use this host's (or --sim) GPUs."),
    sim: str | None = SimOption,
    seed: int = SeedOption,
    out: Path | None = typer.Option(None, "--out", help="Write the files into this directory."),
    prefix: str = typer.Option("gpu", "--prefix", help="Node name prefix for a plan."),
    health_check: str | None = typer.Option(
        None,
        "--health-check",
        help="Path where the HealthCheckProgram wrapper will live; "
        "writes it (running `gpufleet health --exit-code`) and sets HealthCheckProgram.",
    ),
    slurm_conf_path: str = typer.Option(
        "/etc/slurm/slurm.conf", "--slurm-conf-path", help="SLURM_CONF the wrapper exports."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Generate Slurm node, partition, GRES (typed GPUs) and topology configuration."""
    from gpufleet.schedulers.slurm import config_gen as cg

    if (plan is None) == (not inventory and sim is None):
        raise UsageError("give exactly one of --plan PLAN.json or --inventory [--sim SPEC]")
    if plan is not None:
        try:
            doc = json.loads(plan.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{plan}: cannot read: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{plan}: line {exc.lineno}: not JSON: {exc.msg}") from exc
        cluster = cg.from_plan(doc, prefix=prefix, source=str(plan))
    else:
        cluster = cg.from_inventory(_inventory_doc(sim, seed), source="inventory")
    files = {
        "slurm.conf": cg.slurm_conf(cluster, health_check_program=health_check),
        "gres.conf": cg.gres_conf(cluster),
        "topology.conf": cg.topology_conf(cluster),
    }
    if health_check:
        files["healthcheck.sh"] = cg.health_check_wrapper(
            slurm_conf_path, ["gpufleet", "health", "--exit-code"]
        )
    written: list[str] = []
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (out / name).write_text(text, encoding="utf-8")
                written.append(str(out / name))
            if health_check:
                (out / "healthcheck.sh").chmod(0o755)
        except OSError as exc:
            raise ConfigError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    if as_json:
        emit_json(
            {
                "files": files,
                "written": written,
                "nodes": len(cluster.nodes),
                "notes": list(cluster.notes),
            }
        )
        return
    if written:
        for w in written:
            console.print(f"wrote {w}", highlight=False)
    else:
        for name, text in files.items():
            console.print(f"[bold]# ---- {name}[/]")
            typer.echo(text, nl=False)
    for note in cluster.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def register_config(config_app: typer.Typer) -> None:
    """Attach this module's generators to the `gpufleet config` group."""
    config_app.command("slurm")(config_slurm)
