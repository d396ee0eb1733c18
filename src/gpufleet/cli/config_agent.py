"""`gpufleet config agent-systemd`: a systemd unit that runs the node agent; with
``--run-jobs`` one that fits the jobs the agent starts (they inherit the unit's settings)."""

from __future__ import annotations

import typer

from gpufleet.cli.common import JsonOption, http_url
from gpufleet.cli.output import emit_json
from gpufleet.cli.systemd_unit import service_unit

# The agent alone is a small, read-only daemon: confine it. Jobs (``--run-jobs``) are its
# children, in its control group, and inherit every one of these settings: a 512 MiB memory cap
# and a read-only file system would kill or break any real job.
AGENT_ONLY = (
    "NoNewPrivileges=true",
    "ProtectSystem=strict",
    "ProtectHome=true",
    "PrivateTmp=true",
    "CPUWeight=20",
    "MemoryMax=512M",
    "Nice=5",
)
# With jobs: no caps the jobs would inherit; a job killed for memory (the kernel's or systemd's
# OOM killer) must not stop the agent and its other jobs (OOMPolicy's default for services is
# to stop the whole unit); the agent may give jobs their own cgroups (Delegate); GPU jobs need
# locked memory (RDMA, NCCL) and many files and threads.
WITH_JOBS = (
    "Delegate=yes",
    "OOMPolicy=continue",
    "TasksMax=infinity",
    "LimitMEMLOCK=infinity",
    "LimitNOFILE=1048576",
    # stopping or restarting the agent stops its jobs with it (SIGTERM to all, then SIGKILL):
    # no job is left running on a GPU that no agent accounts for
    "KillMode=control-group",
    "TimeoutStopSec=30",
)


def agent_unit(
    *,
    exec_path: str = "/usr/local/bin/gpufleet",
    listen: str = "0.0.0.0:9400",
    controller: str | None = None,
    token_file: str = "/etc/gpufleet/agent.env",
    state_dir: str = "/var/lib/gpufleet/agent",
    user: str = "gpufleet",
    run_jobs: bool = False,
    ca: str | None = None,
) -> str:
    """The unit text. The token comes from an EnvironmentFile (GPUFLEET_AGENT_TOKEN=...), never
    from the command line, so it does not show in ``ps``. ``run_jobs``: the agent runs the
    embedded scheduler's jobs, so the unit holds nothing a job could not live with."""
    args = [exec_path, "agent", "--listen", listen, "--state-dir", state_dir]
    if controller:
        args += ["--controller", controller]
    if ca:
        args += ["--ca", ca]
    if run_jobs:
        args += ["--run-jobs"]
    return service_unit(
        description="gpufleet node agent (GPU telemetry, health, /metrics"
        + (", jobs)" if run_jobs else ")"),
        after="nvidia-persistenced.service",
        user=user,
        env_file=token_file,
        argv=args,
        settings=[*WITH_JOBS] if run_jobs else [*AGENT_ONLY, f"ReadWritePaths={state_dir}"],
        state_dir=state_dir,
    )


def _listen(value: str) -> str:
    """The agent's own ``--listen`` check, so the unit never holds a value it rejects."""
    from gpufleet.agent.server import parse_listen

    parse_listen(value)
    return value


def register_config(config_app: typer.Typer) -> None:
    """Attach `gpufleet config agent-systemd`."""

    @config_app.command("agent-systemd")
    def agent_systemd(
        exec_path: str = typer.Option("/usr/local/bin/gpufleet", "--exec", help="gpufleet path."),
        listen: str = typer.Option("0.0.0.0:9400", "--listen", help="HOST:PORT to serve on."),
        controller: str | None = typer.Option(None, "--controller", help="Control plane URL."),
        token_file: str = typer.Option(
            "/etc/gpufleet/agent.env", "--env-file", help="File with GPUFLEET_AGENT_TOKEN=..."
        ),
        state_dir: str = typer.Option("/var/lib/gpufleet/agent", "--state-dir"),
        user: str = typer.Option("gpufleet", "--user", help="Service user (in group video)."),
        run_jobs: bool = typer.Option(
            False,
            "--run-jobs",
            help="The agent runs jobs: a unit without the memory cap and read-only file system "
            "the jobs would inherit.",
        ),
        ca: str | None = typer.Option(
            None, "--ca", help="PEM CA bundle the agent verifies an https controller with."
        ),
        json_out: bool = JsonOption,
    ) -> None:
        """Print a systemd unit for the node agent (install as gpufleet-agent.service)."""
        text = agent_unit(
            exec_path=exec_path,
            listen=_listen(listen),
            controller=None if controller is None else http_url(controller, "--controller"),
            token_file=token_file,
            state_dir=state_dir,
            user=user,
            run_jobs=run_jobs,
            ca=ca,
        )
        if json_out:
            emit_json({"name": "gpufleet-agent.service", "unit": text})
        else:
            typer.echo(text, nl=False)
