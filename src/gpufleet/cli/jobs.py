"""`gpufleet jobs submit|list|show|cancel|logs`: jobs on the embedded scheduler.

Without ``--controller`` every command works on a local embedded scheduler kept in a state
directory (``--state-dir``; SQLite store plus one folder per job copy). Each call ticks the
scheduler once: it records finished jobs and starts what fits, so no daemon is needed on one
machine. With ``--controller URL --token-file F`` (or ``GPUFLEET_TOKEN_FILE``; ``--token`` and
``GPUFLEET_TOKEN`` work too but show in ``ps``/the environment) they talk to a control plane's
jobs API (``/api/v1/jobs``), whatever scheduler backend it runs (embedded, Slurm).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli.common import JsonOption, SeedOption, TokenFileOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json, fmt
from gpufleet.cli.process import CaOption
from gpufleet.cli.remote import Remote
from gpufleet.errors import NoDeviceError, UsageError
from gpufleet.schedulers.base import JobAttempt, JobSpec
from gpufleet.wire.jobs import JOB_SPEC

if TYPE_CHECKING:
    from gpufleet.schedulers.embedded import EmbeddedScheduler, NodeInfo

DEFAULT_STATE_DIR = (
    Path(os.environ.get("XDG_DATA_HOME", str(Path.home() / ".local" / "share")))
    / "gpufleet"
    / "scheduler"
)

jobs_app = typer.Typer(
    help=(
        "Submit and watch jobs: on a control plane (--controller URL --token T) or on a "
        "local embedded scheduler (state directory)."
    ),
    no_args_is_help=True,
)

StateDirOption = typer.Option(
    DEFAULT_STATE_DIR, "--state-dir", help="Local scheduler state (store, job logs)."
)
ControllerOption = typer.Option(
    None, "--controller", help="Control-plane URL (else: the local state directory)."
)
TokenOption = typer.Option(
    None, "--token", envvar="GPUFLEET_TOKEN", help="Bearer token for --controller."
)
NodesSimOption = typer.Option(
    None,
    "--sim",
    help="Schedule on a simulated fleet's GPUs (NODESxGPUSxMODEL); processes still run here.",
    metavar="SPEC",
)
JobIdArgument = typer.Argument(..., help="Job id.")


def job_remote(
    controller: str | None = ControllerOption,
    token: str | None = TokenOption,
    token_file: Path | None = TokenFileOption,
    ca: Path | None = CaOption,
) -> Remote:
    """The control-plane options of `gpufleet jobs` (and `energy`): ``--controller`` (else the
    local scheduler), its token and ``--ca``."""
    return Remote(controller, token, token_file, ca)


def _local_nodes(sim: str | None, seed: int) -> list[NodeInfo]:
    from gpufleet.devices.sim import SimFleet, parse_fleet_spec
    from gpufleet.schedulers.embedded.placement import GpuSlot, NodeInfo, nodes_from_sim

    if sim:
        return list(nodes_from_sim(SimFleet(parse_fleet_spec(sim, seed=seed))))
    from gpufleet.catalog import load_catalog
    from gpufleet.devices.discovery import node_inventory, open_local_nvml

    fleet = open_local_nvml()
    try:
        inv, _notes = node_inventory(fleet.backends[0])
    finally:
        fleet.close()
    cat = load_catalog()
    slots = []
    for g in inv.gpus:
        model = g.model or (m.key if (m := cat.gpu_by_nvml_name(g.name)) else g.name)
        slots.append(GpuSlot(g.index, model, g.memory_total_bytes or 0))
    return [NodeInfo(socket.gethostname(), tuple(slots))]


@contextlib.contextmanager
def local_scheduler(
    state_dir: Path, sim: str | None = None, seed: int = 7, *, discover: bool = True
) -> Iterator[EmbeddedScheduler]:
    """The embedded scheduler over ``state_dir``, under an exclusive lock, ticked once.
    ``discover``: find this host's GPUs when the store knows no node (submitting needs them;
    listing, showing, cancelling and reading logs do not)."""
    from gpufleet.private import private_dir, private_file
    from gpufleet.schedulers.embedded import EmbeddedScheduler, JobStore, LocalProcessExecutor

    state_dir = private_dir(state_dir.expanduser())  # job env and logs: 0700 / 0600
    with open(private_file(state_dir / "lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        store = JobStore.open(private_file(state_dir / "sched.db"))
        try:
            nodes: list[NodeInfo] = []
            if sim or (discover and not store.nodes()):
                try:
                    nodes = _local_nodes(sim, seed)
                except NoDeviceError as exc:
                    raise NoDeviceError(
                        f"{exc.message}; the scheduler needs GPUs to place jobs on",
                        hint="pass --sim 1x8xh100 to schedule on a simulated node",
                    ) from exc
            executor = LocalProcessExecutor(root=private_dir(state_dir / "runs"))
            eng = EmbeddedScheduler(store, executor, nodes)
            eng.tick()
            yield eng
        finally:
            store.close()


def _env_pairs(values: list[str] | None) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


# restarts: the job's own non-zero exits; requeues: infrastructure (node lost, fail finding)
BUDGET_COLS = ("restarts", "requeues")


@jobs_app.command("submit")
@option_groups(remote=job_remote)
def submit(
    command: list[str] = typer.Argument(None, help="The command to run (after --)."),
    name: str = typer.Option(None, "--name", help="Job name (default: the command's name)."),
    tenant: str = typer.Option(
        None,
        "--tenant",
        help="Tenant (default: with --controller the token's tenant, else 'default').",
    ),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs per node."),
    nodes: int = typer.Option(1, "--nodes"),
    gpu_model: str = typer.Option(None, "--gpu-model", help="e.g. h100-sxm (aliases accepted)."),
    min_mem_gib: float = typer.Option(None, "--min-gpu-memory-gib"),
    mig_profile: str = typer.Option(None, "--mig-profile", help="Not supported (embedded)."),
    image: str = typer.Option(None, "--image", help="Container image (not run locally)."),
    priority: int = typer.Option(0, "--priority"),
    max_restarts: int = typer.Option(
        3,
        "--max-restarts",
        min=0,
        help="Restarts after the job's own non-zero exits (then it fails). Node loss, fail "
        "findings and fencing never count here.",
    ),
    max_requeues: int = typer.Option(
        10,
        "--max-requeues",
        min=0,
        help="Requeues for infrastructure (node lost, fail finding, fencing): the job moves to "
        "another node this many times at most.",
    ),
    checkpoint_dir: str = typer.Option(None, "--checkpoint-dir"),
    env: list[str] = typer.Option(None, "--env", help="KEY=VALUE (repeatable)."),
    duration: float = typer.Option(
        None, "--duration", help="Simulated nodes: seconds of simulated GPU work."
    ),
    sim: str = NodesSimOption,
    seed: int = SeedOption,
    state_dir: Path = StateDirOption,
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Submit a job: `gpufleet jobs submit --gpus 2 -- python train.py`."""
    if not command and not image:
        raise UsageError("give a command after -- (or --image)")
    spec = JobSpec(
        name=name or (Path(command[0]).name if command else str(image)),
        tenant=tenant or "default",
        command=tuple(command or ()),
        image=image,
        gpus=gpus,
        gpu_model=gpu_model,
        min_gpu_memory_bytes=None if min_mem_gib is None else int(min_mem_gib * 2**30),
        mig_profile=mig_profile,
        nodes=nodes,
        priority=priority,
        max_restarts=max_restarts,
        max_requeues=max_requeues,
        checkpoint_dir=checkpoint_dir,
        env=_env_pairs(env),
        duration_s=duration,
    )
    if remote.controller:
        body = JOB_SPEC.dump_python(spec, mode="json", exclude_none=True)
        name, command = body.pop("name"), body.pop("command")
        if tenant is None:  # the controller takes the token's tenant
            body.pop("tenant", None)
        with remote.client() as client:
            job = client.submit(name, command, **body)
        if as_json:
            emit_json(job.model_dump(mode="json"))
        else:
            console.print(f"job {job.id} ({job.name}): {job.state} {job.reason}")
        return
    with local_scheduler(state_dir, sim, seed) as eng:
        job_id = eng.submit(spec)
        eng.tick()
        status = eng.job(job_id).status()
    if as_json:
        emit_json(status)
    else:
        console.print(f"job {job_id} ({spec.name}): {status.state.value} {status.reason}".strip())


@jobs_app.command("list")
@option_groups(remote=job_remote)
def list_jobs(
    state_dir: Path = StateDirOption,
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """List jobs, newest last."""
    from rich.table import Table

    if remote.controller:
        with remote.client() as client:
            remote_jobs = client.jobs()
        if as_json:
            emit_json({"jobs": [j.model_dump(mode="json") for j in remote_jobs]})
            return
        table = Table("id", "name", "tenant", "state", "nodes", "gpus", *BUDGET_COLS, "reason")
        for rj in remote_jobs:
            table.add_row(
                rj.id,
                rj.name,
                rj.tenant,
                rj.state,
                ",".join(rj.nodes) or "-",
                str(rj.gpus),
                str(rj.restarts),
                str(rj.requeues),
                rj.reason,
            )
        console.print(table)
        return
    with local_scheduler(state_dir, discover=False) as eng:
        jobs = eng.list_jobs()
    if as_json:
        emit_json(jobs)
        return
    # "gpus" means what the job asks for (per node x nodes), as with --controller; the indices
    # it runs on are their own column
    table = Table(
        "id", "name", "tenant", "state", "nodes", "gpus", "on gpus", *BUDGET_COLS, "reason"
    )
    for j in jobs:
        table.add_row(
            j.id,
            j.spec.name,
            j.spec.tenant,
            j.state.value,
            ",".join(j.nodes) or "-",
            str(j.spec.gpus * j.spec.nodes),
            ",".join(str(g) for g in j.gpus) or "-",
            str(j.restarts),
            str(j.requeues),
            j.reason,
        )
    console.print(table)


@jobs_app.command("show")
@option_groups(remote=job_remote)
def show(
    job_id: str = JobIdArgument,
    state_dir: Path = StateDirOption,
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """A job's spec, state and every attempt (where and how each copy ran); ``--json``: the
    same document as ``GET /api/v1/jobs/{id}``, with or without ``--controller``."""
    from gpufleet.schedulers.views import job_detail

    if remote.controller:
        with remote.client() as client:
            d = client.job(job_id)
    else:
        with local_scheduler(state_dir, discover=False) as eng:
            status = eng.job(job_id).status()
            attempts = [
                JobAttempt(a.generation, tuple(a.nodes), a.started_at, a.ended_at, a.outcome)
                for a in eng.attempts(job_id)
            ]
            log = eng.log_path(job_id)
        d = job_detail(status, attempts, log=str(log) if log else None)
    if as_json:
        emit_json(d.model_dump(mode="json"))
        return
    console.print(f"[bold]job {d.id}[/] {d.name} (tenant {d.tenant}): {d.state}")
    console.print(f"  command: {shlex.join(d.command) or fmt(d.image)}")
    console.print(f"  gpus: {d.gpus_per_node} x {d.node_count} node(s); priority {d.priority}")
    console.print(f"  nodes: {','.join(d.nodes) or '-'}")
    console.print(
        f"  restarts: {d.restarts}/{d.max_restarts} (own exits); "
        f"requeues: {d.requeues}/{d.max_requeues} (infrastructure)"
    )
    console.print(f"  exit {fmt(d.exit_code)}; reason: {d.reason or '-'}")
    if d.log is not None:
        console.print(f"  log: {d.log}")
    for at in d.attempts:
        console.print(
            f"  attempt gen {at.generation} on {','.join(at.nodes)}: "
            f"{fmt(at.started_at_s, digits=1)} -> {fmt(at.ended_at_s, digits=1)} {at.outcome}"
        )
    e = d.energy
    if e:
        cost = f", {e['cost']:.2f} {e['currency']}" if e.get("cost") is not None else ""
        co2 = f", {e['co2_kg']:.2f} kg CO2" if e.get("co2_kg") is not None else ""
        console.print(
            f"  energy: {e['kwh']:.3f} kWh{cost}{co2} over {e['gpu_hours']:.2f} GPU-hours "
            f"({e['method']})"
        )


@jobs_app.command("cancel")
@option_groups(remote=job_remote)
def cancel(
    job_id: str = JobIdArgument,
    state_dir: Path = StateDirOption,
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Cancel a job (kills its running copies)."""
    if remote.controller:
        with remote.client() as client:
            cancelled = client.cancel(job_id)
        if as_json:
            emit_json(cancelled.model_dump(mode="json"))
        else:
            console.print(f"job {job_id}: {cancelled.state}")
        return
    with local_scheduler(state_dir, discover=False) as eng:
        eng.cancel(job_id)
        status = eng.job(job_id).status()
    if as_json:
        emit_json(status)
    else:
        console.print(f"job {job_id}: {status.state.value}")


@jobs_app.command("logs")
@option_groups(remote=job_remote)
def logs(
    job_id: str = JobIdArgument,
    tail: int = typer.Option(0, "--tail", help="Only the last N lines (0: all)."),
    state_dir: Path = StateDirOption,
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Print the output of the job's latest copy."""
    if remote.controller:
        with remote.client() as client:
            text = client.logs(job_id, tail=tail)
        if as_json:
            emit_json({"job": job_id, "log": None, "text": text})
        else:
            typer.echo(text, nl=False)
        return
    with local_scheduler(state_dir, discover=False) as eng:
        path = eng.log_path(job_id)
    text = path.read_text(encoding="utf-8", errors="replace") if path else ""
    if tail > 0:
        text = "".join(text.splitlines(keepends=True)[-tail:])
    if as_json:
        emit_json({"job": job_id, "log": str(path) if path else None, "text": text})
    elif path is None:
        console.print(f"job {job_id}: no log yet")
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    """Attach ``gpufleet jobs`` to the app."""
    app.add_typer(jobs_app, name="jobs")
