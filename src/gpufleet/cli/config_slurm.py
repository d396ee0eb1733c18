"""`gpufleet config slurm`: slurm.conf node/partition lines, gres.conf and topology.conf from a
plan (``gpufleet plan --json``) or an inventory (this host's GPUs and CPU topology, ``--sim
SPEC``, or ``gpufleet inventory --json`` files gathered from the nodes), and the
HealthCheckProgram wrapper that drains and resumes nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.common import JsonOption, SeedOption, SimOption, http_url, read_token
from gpufleet.cli.output import console, emit_json
from gpufleet.errors import ConfigError, UsageError


def _inventory_doc(sim: str | None, seed: int) -> dict[str, Any]:
    from gpufleet.cli.inventory import inventory_document
    from gpufleet.cli.output import to_jsonable
    from gpufleet.devices.discovery import collect, open_fleet

    fleet = open_fleet(sim=sim, seed=seed).bounded()
    try:
        nodes, notes = collect(fleet)
    finally:
        fleet.close()
    doc: dict[str, Any] = to_jsonable(inventory_document(nodes, [], notes))
    if fleet.kind == "nvml":  # this host: each GPU's nearby cores from /sys (gres.conf Cores=)
        from gpufleet.schedulers.slurm.node_facts import gpu_cores

        for node in doc.get("nodes") or []:
            gpus = node.get("gpus") or []
            cores = gpu_cores([g.get("pci_bus_id") for g in gpus])
            for g, c in zip(gpus, cores or [], strict=False):
                g["cores"] = c
    return doc


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not JSON: {exc.msg}") from exc


def _inventory_files(files: list[Path]) -> dict[str, Any]:
    """One inventory of every node in ``gpufleet inventory --json`` files (e.g. one per node);
    a node named twice is an error naming both files."""
    nodes: list[Any] = []
    seen: dict[str, Path] = {}
    for f in files:
        doc = _json_file(f)
        listed = doc.get("nodes") if isinstance(doc, dict) else None
        if not isinstance(listed, list):
            raise ConfigError(f"{f}: 'nodes' is missing (is this gpufleet inventory --json?)")
        for n in listed:
            name = n.get("name") if isinstance(n, dict) else None
            if isinstance(name, str) and name in seen:
                raise ConfigError(f"{f}: node {name!r} is also in {seen[name]}")
            if isinstance(name, str):
                seen[name] = f
            nodes.append(n)
    return {"nodes": nodes}


PAGE = 5000  # the nodes API's largest page


def _controller_inventory(url: str, token_file: Path | None) -> dict[str, Any]:
    """The controller's nodes in `gpufleet inventory --json`'s shape: each node's GPUs (model,
    driver) and the CPU topology and memory its agent reported (``host``)."""
    from gpufleet.client import Client

    http_url(url, "--inventory-from")
    token = read_token(None, token_file, "--inventory-token-file")
    if not token:
        raise UsageError("--inventory-from needs --inventory-token-file (or GPUFLEET_TOKEN_FILE)")
    nodes: list[dict[str, Any]] = []
    with Client(url, token, timeout_s=10.0) as client:
        listed: list[Any] = []
        while True:  # pages of the API's largest size
            page = client.nodes(limit=PAGE, offset=len(listed))
            listed.extend(page)
            if len(page) < PAGE:
                break
        for n in listed:
            detail = client.node(n.name).model_dump(mode="json", exclude_unset=True)
            gpus = [
                {
                    "model": d.get("model"),
                    "driver_version": (d.get("info") or {}).get("driver_version"),
                }
                for d in detail.get("devices") or []
            ]
            nodes.append({"name": n.name, "gpus": gpus, "host": detail.get("host")})
    return {"nodes": nodes}


def config_slurm(
    plan: Path | None = typer.Option(None, "--plan", help="A plan from `gpufleet plan --json`."),
    inventory: bool = typer.Option(
        False, "--inventory", help="Use this host's (or --sim) GPUs, CPU topology and memory."
    ),
    inventory_files: list[Path] | None = typer.Option(
        None,
        "--inventory-file",
        help="`gpufleet inventory --json` output (repeat: one per node); implies --inventory.",
    ),
    inventory_from: str | None = typer.Option(
        None,
        "--inventory-from",
        help="A controller's URL: its nodes' GPUs and the CPU topology and memory their agents "
        "reported (token: --inventory-token-file or GPUFLEET_TOKEN_FILE); implies --inventory.",
        metavar="URL",
    ),
    inventory_token_file: Path | None = typer.Option(
        None,
        "--inventory-token-file",
        envvar="GPUFLEET_TOKEN_FILE",
        help="Token (viewer or above) for --inventory-from, read here.",
        metavar="FILE",
    ),
    sim: str | None = SimOption,
    seed: int = SeedOption,
    out: Path | None = typer.Option(None, "--out", help="Write the files into this directory."),
    prefix: str = typer.Option("gpu", "--prefix", help="Node name prefix for a plan."),
    health_check: str | None = typer.Option(
        None,
        "--health-check",
        help="Path where the HealthCheckProgram wrapper will live; writes it (running "
        "`gpufleet health --exit-code --slurm-drain`) and sets HealthCheckProgram.",
    ),
    slurm_conf_path: str = typer.Option(
        "/etc/slurm/slurm.conf", "--slurm-conf-path", help="SLURM_CONF the wrapper exports."
    ),
    controller: str | None = typer.Option(
        None, "--controller", help="The health check asks this controller's circuit breaker."
    ),
    token_file: str | None = typer.Option(
        None,
        "--token-file",
        help="With --controller: path of the token file ON THE NODES (not read here).",
    ),
    max_drained: str | None = typer.Option(
        None,
        "--max-drained",
        help="Without --controller: most Slurm nodes the checks may drain at once, N or P% "
        "(default 10%, at least 1).",
    ),
    health_log: str = typer.Option(
        "/var/log/gpufleet/health-check.log",
        "--health-log",
        help="Where the health check appends its decisions (slurmd keeps no output).",
    ),
    interval: int = typer.Option(
        30, "--health-interval", min=1, help="HealthCheckInterval in seconds."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Generate Slurm node, partition, GRES (typed GPUs) and topology configuration."""
    from gpufleet.schedulers.slurm import config_gen as cg
    from gpufleet.schedulers.slurm.local_drain import parse_max_drained

    use_inventory = inventory or bool(inventory_files) or sim is not None or bool(inventory_from)
    if (plan is None) == (not use_inventory):
        raise UsageError(
            "give exactly one of --plan PLAN.json or --inventory [--sim SPEC | --inventory-file F"
            " | --inventory-from URL]"
        )
    if sum(map(bool, (sim is not None, inventory_files, inventory_from))) > 1:
        raise UsageError("give one of --sim, --inventory-file and --inventory-from")
    if controller is not None:
        http_url(controller, "--controller")
        if not token_file:
            raise UsageError("--controller needs --token-file (its path on the nodes)")
        if max_drained:
            raise UsageError("give --controller (its circuit breaker decides) or --max-drained")
    if max_drained is not None:
        parse_max_drained(max_drained)
    if plan is not None:
        doc = _json_file(plan)
        if not isinstance(doc, dict):
            raise ConfigError(f"{plan}: expected a JSON object (gpufleet plan --json)")
        cluster = cg.from_plan(doc, prefix=prefix, source=str(plan))
    elif inventory_files:
        source = ", ".join(map(str, inventory_files))
        cluster = cg.from_inventory(_inventory_files(inventory_files), source=source)
    elif inventory_from:
        doc = _controller_inventory(inventory_from, inventory_token_file)
        cluster = cg.from_inventory(doc, source=inventory_from)
    else:
        cluster = cg.from_inventory(_inventory_doc(sim, seed), source="inventory")
    files = {
        "slurm.conf": cg.slurm_conf(
            cluster, health_check_program=health_check, health_check_interval_s=interval
        ),
        "gres.conf": cg.gres_conf(cluster),
        "topology.conf": cg.topology_conf(cluster),
    }
    if health_check:
        command = cg.health_check_command(
            controller=controller, token_file=token_file, max_drained=max_drained
        )
        files["healthcheck.sh"] = cg.health_check_wrapper(slurm_conf_path, command, health_log)
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
