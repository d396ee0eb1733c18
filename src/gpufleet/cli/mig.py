"""`gpufleet mig plan` (MIG packing, re-planning, emitters) and `gpufleet mig sharing ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import console, emit_json, fit
from gpufleet.errors import ConfigError, UsageError

mig_app = typer.Typer(help="Plan MIG layouts and GPU sharing.", no_args_is_help=True)
sharing_app = typer.Typer(
    help="GPU sharing without MIG: time-slicing and MPS.", no_args_is_help=True
)


def _fleet(gpus: str | None, inventory: Path | None, plan_file: Path | None, current: Path | None):  # type: ignore[no-untyped-def]
    from gpufleet.mig import fleet

    given = [x for x in (gpus, inventory, plan_file) if x is not None]
    if current is not None and not given:
        return fleet.load_current(current)
    if len(given) != 1:
        raise UsageError("give exactly one of --gpus, --inventory, --plan (or only --current)")
    if gpus is not None:
        out = fleet.parse_gpus(gpus)
    elif inventory is not None:
        out = fleet.fleet_from_inventory(inventory)
    else:
        assert plan_file is not None
        out = fleet.fleet_from_plan(plan_file)
    if current is None:
        return out
    today = {(g.node, g.index): g for g in fleet.load_current(current)}
    missing = [f"{g.node}/{g.index}" for g in out if (g.node, g.index) not in today]
    if missing:
        raise ConfigError(f"{current}: no current layout for GPU(s) {', '.join(missing[:5])}")
    return [today[(g.node, g.index)] for g in out]


def _write(out: Path, files: dict[str, str]) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write: {exc.strerror or exc}") from exc


def plan_cmd(
    gpus: str | None = typer.Option(None, "--gpus", help="[NODES x] GPUS x MODEL, e.g. 8xh200."),
    inventory: Path | None = typer.Option(None, "--inventory", help="gpufleet inventory --json."),
    plan_file: Path | None = typer.Option(None, "--plan", help="gpufleet plan --json output."),
    demand: str | None = typer.Option(
        None, "--demand", help="'team-a: 6 x 1g.18gb, team-b: 2 x 3g.71gb'."
    ),
    demand_file: Path | None = typer.Option(None, "--demand-file", help="YAML demand file."),
    mix: str | None = typer.Option(None, "--mix", help="Target mix 'PROFILE:WEIGHT, ...'."),
    current: Path | None = typer.Option(
        None, "--current", help="Today's layout (YAML); re-plan with fewest re-partitions."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write config files into DIR."),
    time_limit_s: float = typer.Option(60.0, "--time-limit", help="Solver time limit (s)."),
    as_json: bool = JsonOption,
) -> None:
    """Pack MIG demand onto GPUs: exact plan beside a first-fit baseline."""
    from gpufleet.mig import demand as dm
    from gpufleet.mig import emit
    from gpufleet.mig.fleet import current_document
    from gpufleet.mig.layouts import profile_names
    from gpufleet.mig.planner import plan_exact, plan_first_fit, plan_mix

    fleet = _fleet(gpus, inventory, plan_file, current)
    known = profile_names(g.model for g in fleet)
    if not known:
        raise UsageError("none of these GPUs supports MIG")
    if sum(x is not None for x in (demand, demand_file, mix)) != 1:
        raise UsageError("give exactly one of --demand, --demand-file, --mix")
    if mix is not None:
        exact = plan_mix(fleet, dm.parse_mix(mix, known), time_limit_s=time_limit_s)
        wanted = exact.demand
    else:
        wanted = (
            dm.parse_demand(demand, known)
            if demand is not None
            else dm.load_demand_file(demand_file, known)  # type: ignore[arg-type]
        )
        with console.status("solving", spinner="dots") if not as_json else _Null():
            exact = plan_exact(fleet, wanted, time_limit_s=time_limit_s)
    baseline = plan_first_fit(fleet, wanted)
    parted = emit.mig_parted_config(exact)
    labels = emit.node_labels(exact)
    slurm = emit.slurm_lines(exact)
    layout_doc = current_document([(r.gpu, r.layout) for r in exact.gpus])
    if out is not None:
        _write(
            out,
            {
                "mig-parted.yaml": yaml.safe_dump(parted, sort_keys=False),
                "node-labels.sh": "\n".join(emit.kubectl_label_commands(exact)) + "\n",
                "slurm-gres.conf": "\n".join(slurm["gres.conf"]) + "\n",
                "slurm-nodes.conf": "\n".join(slurm["slurm.conf"]) + "\n",
                "layout.yaml": yaml.safe_dump(layout_doc, sort_keys=False),
            },
        )
    if as_json:
        emit_json(
            {
                "exact": _plan_json(exact),
                "first_fit": _plan_json(baseline),
                "mig_parted": parted,
                "node_labels": labels,
                "kubectl": emit.kubectl_label_commands(exact),
                "slurm": slurm,
                "layout": layout_doc,
            }
        )
        return
    console.print(fit(emit.plan_table(exact)))
    rows = [("", "exact", "first-fit")]
    for k in (
        "placed_instances",
        "placed_compute_slices",
        "gpus_used",
        "gpus_repartitioned",
        "memory_slices_stranded",
        "spare_instances",
    ):
        rows.append((k, str(exact.summary()[k]), str(baseline.summary()[k])))
    for r in rows:
        console.print(f"{r[0]:<24}{r[1]:>10}{r[2]:>12}", highlight=False)
    console.print(f"demanded instances: {exact.demanded_instances}", highlight=False)
    for tenant, d in exact.unplaced.items():
        console.print(f"[yellow]unplaced[/] {tenant}: {d}", highlight=False)
    for note in exact.notes:
        console.print(f"note: {note}", highlight=False)
    if out is not None:
        console.print(f"wrote {out}/mig-parted.yaml, node-labels.sh, slurm-*.conf, layout.yaml")


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None


def _plan_json(plan: Any) -> dict[str, Any]:
    return {
        **plan.summary(),
        "placed": plan.placed,
        "unplaced": plan.unplaced,
        "notes": list(plan.notes),
        "gpus": [
            {
                "node": r.gpu.node,
                "index": r.gpu.index,
                "model": r.gpu.model,
                "layout": r.layout.counts,
                "repartition": r.repartition,
                "instances": [
                    {
                        "profile": a.placement.profile,
                        "start": a.placement.start,
                        "size": a.placement.size,
                        "tenant": a.tenant,
                    }
                    for a in r.assignments
                ],
            }
            for r in plan.gpus
        ],
    }


def _emit_doc(doc: dict[str, Any], as_json: bool, out: Path | None, name: str) -> None:
    if out is not None:
        _write(out, {name: yaml.safe_dump(doc, sort_keys=False)})
    if as_json:
        emit_json(doc)
    else:
        typer.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)


def time_slicing_cmd(
    replicas: int = typer.Option(..., "--replicas", help="Pods per GPU."),
    resource: str = typer.Option("nvidia.com/gpu", "--resource", help="Resource to share."),
    rename: str | None = typer.Option(None, "--rename", help="Advertise under this name."),
    out: Path | None = typer.Option(None, "--out", help="Write time-slicing.yaml into DIR."),
    as_json: bool = JsonOption,
) -> None:
    """NVIDIA device-plugin time-slicing config."""
    from gpufleet.mig.sharing import time_slicing_config

    doc = time_slicing_config(replicas, resource=resource, rename=rename)
    _emit_doc(doc, as_json, out, "time-slicing.yaml")


def mps_cmd(
    replicas: int = typer.Option(..., "--replicas", help="MPS clients per GPU."),
    resource: str = typer.Option("nvidia.com/gpu", "--resource", help="Resource to share."),
    out: Path | None = typer.Option(None, "--out", help="Write mps.yaml into DIR."),
    as_json: bool = JsonOption,
) -> None:
    """NVIDIA device-plugin MPS config (Kubernetes)."""
    from gpufleet.mig.sharing import mps_config

    _emit_doc(mps_config(replicas, resource=resource), as_json, out, "mps.yaml")


def _devices(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(d < 0 for d in out):
        raise UsageError(f"--device {text!r}: expected GPU indexes, e.g. 0 or 0,1,2")
    return out


PipeDirOption = typer.Option(
    "/tmp/nvidia-mps-{gpu}",
    "--pipe-dir",
    help="Per-GPU pipe directory ({gpu}: the index).",
    metavar="DIR",
)


def mps_daemon_cmd(
    device: str = typer.Option("0", "--device", help="GPU index(es): 0 or 0,1,2.", metavar="GPUS"),
    client: list[str] = typer.Option(
        ..., "--client", help="NAME:PERCENT[:MEMORY], repeatable.", metavar="CLIENT"
    ),
    model: str | None = typer.Option(
        None, "--model", help="GPU model, to check memory limits.", metavar="MODEL"
    ),
    pipe_dir: str = PipeDirOption,
    log_dir: str = typer.Option(
        "/var/log/nvidia-mps-{gpu}", "--log-dir", help="Per-GPU log directory.", metavar="DIR"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Bare-metal MPS: per-GPU start/check/stop commands and each client's environment."""
    from gpufleet.catalog import load_catalog
    from gpufleet.mig.sharing import mps_commands, parse_mps_clients

    mem = load_catalog().gpu(model).memory_bytes if model else None
    clients = parse_mps_clients(client)
    docs = [
        mps_commands(d, clients, pipe_dir=pipe_dir, log_dir=log_dir, gpu_memory_bytes=mem)
        for d in _devices(device)
    ]
    if as_json:
        emit_json(docs[0] if len(docs) == 1 else {"devices": docs})
        return
    for doc in docs:
        typer.echo(f"# GPU {doc['device']}: pipes in {doc['pipe_dir']}, logs in {doc['log_dir']}")
        typer.echo("# start\n" + "\n".join(doc["start"]))
        typer.echo("# check (gpufleet mig sharing mps-status)\n" + "\n".join(doc["check"]))
        typer.echo("# stop\n" + "\n".join(doc["stop"]))
        for c in doc["clients"]:
            typer.echo(f"# client {c['name']}\n{c['run']}")
        for w in doc["warnings"]:
            console.print(f"[yellow]warning:[/] {w}", highlight=False)


def mps_status_cmd(
    device: str = typer.Option("0", "--device", help="GPU index(es): 0 or 0,1,2.", metavar="GPUS"),
    pipe_dir: str = PipeDirOption,
    as_json: bool = JsonOption,
) -> None:
    """Whether each GPU's MPS control daemon runs, and its servers. Exit 0 all running,
    2 one stopped, 3 one unknown (the control program missing or not answering)."""
    from gpufleet.mig.mps_status import mps_status
    from gpufleet.mig.sharing import mps_dirs

    found = [mps_status(d, mps_dirs(d, pipe_dir, "{gpu}")[0]) for d in _devices(device)]
    if as_json:
        emit_json({"devices": [s.__dict__ for s in found]})
    else:
        for st in found:
            colour = {"running": "green", "stopped": "red"}.get(st.state, "yellow")
            console.print(
                f"GPU {st.device}: [{colour}]{st.state}[/] ({st.detail})"
                + (f" pids {', '.join(map(str, st.servers))}" if st.servers else ""),
                highlight=False,
            )
    states = {s.state for s in found}
    code = 3 if "unknown" in states else 2 if "stopped" in states else 0
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet mig`."""
    mig_app.command("plan")(plan_cmd)
    sharing_app.command("time-slicing")(time_slicing_cmd)
    sharing_app.command("mps")(mps_cmd)
    sharing_app.command("mps-daemon")(mps_daemon_cmd)
    sharing_app.command("mps-status")(mps_status_cmd)
    mig_app.add_typer(sharing_app, name="sharing")
    app.add_typer(mig_app, name="mig")
