"""`gpufleet config agent-systemd`: a systemd unit that runs the node agent."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from gpufleet.cli.common import JsonOption, http_url
from gpufleet.cli.output import emit_json


def agent_unit(
    *,
    exec_path: str = "/usr/local/bin/gpufleet",
    listen: str = "0.0.0.0:9400",
    controller: str | None = None,
    token_file: str = "/etc/gpufleet/agent.env",
    state_dir: str = "/var/lib/gpufleet/agent",
    user: str = "gpufleet",
) -> str:
    """The unit text. The token comes from an EnvironmentFile (GPUFLEET_AGENT_TOKEN=...), never
    from the command line, so it does not show in ``ps``."""
    args = [exec_path, "agent", "--listen", listen, "--state-dir", state_dir]
    if controller:
        args += ["--controller", controller]
    cmd = " ".join(shlex.quote(a) for a in args)
    state_name = (
        Path(state_dir).relative_to("/var/lib") if state_dir.startswith("/var/lib/") else None
    )
    lines = [
        "[Unit]",
        "Description=gpufleet node agent (GPU telemetry, health, /metrics)",
        "Wants=network-online.target",
        "After=network-online.target nvidia-persistenced.service",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"EnvironmentFile=-{token_file}",
        f"ExecStart={cmd}",
        "Restart=always",
        "RestartSec=5",
        # NVML needs the /dev/nvidia* nodes; keep the rest of the system read-only.
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "ProtectHome=true",
        "PrivateTmp=true",
        f"ReadWritePaths={state_dir}",
        *([f"StateDirectory={state_name}"] if state_name else []),
        "CPUWeight=20",
        "MemoryMax=512M",
        "Nice=5",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


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
        )
        if json_out:
            emit_json({"name": "gpufleet-agent.service", "unit": text})
        else:
            typer.echo(text, nl=False)
