"""`gpufleet config controller-systemd`: a systemd unit that runs the control plane.

Secrets (the PostgreSQL URL with its password, ``GPUFLEET_DB_URL``; a Prometheus URL with
credentials, ``GPUFLEET_PROMETHEUS_URL``) come from an EnvironmentFile the operator creates
mode 0600, never from the command line, where ``ps`` and the journal would show them. The
hardening options are systemd.exec(5)'s sandboxing settings: the controller needs the network
and its state directory, nothing else (no devices, no kernel tunables, no capabilities).
"""

from __future__ import annotations

import typer

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import emit_json
from gpufleet.cli.systemd_unit import service_unit
from gpufleet.errors import UsageError

ENV_FILE = "/etc/gpufleet/controller.env"
DATA_DIR = "/var/lib/gpufleet/controller"
ENV_KEYS = ("GPUFLEET_DB_URL", "GPUFLEET_PROMETHEUS_URL")
HARDENING = (
    "NoNewPrivileges=true",
    "ProtectSystem=strict",
    "ProtectHome=true",
    "PrivateTmp=true",
    "PrivateDevices=true",
    "ProtectKernelTunables=true",
    "ProtectKernelModules=true",
    "ProtectKernelLogs=true",
    "ProtectControlGroups=true",
    "ProtectClock=true",
    "ProtectHostname=true",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces=true",
    "RestrictRealtime=true",
    "RestrictSUIDSGID=true",
    "LockPersonality=true",
    "SystemCallArchitectures=native",
)


def controller_unit(
    *,
    exec_path: str = "/usr/local/bin/gpufleet",
    host: str = "0.0.0.0",
    port: int = 8080,
    env_file: str = ENV_FILE,
    data_dir: str = DATA_DIR,
    user: str = "gpufleet",
    scheduler: str = "embedded",
    policy: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> str:
    """The unit text (install as ``gpufleet-controller.service``)."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected 1-65535")
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    args = [exec_path, "controller", "--host", host, "--port", str(port)]
    args += ["--data-dir", data_dir, "--scheduler", scheduler]
    if policy:
        args += ["--policy", policy]
    if tls_cert and tls_key:
        args += ["--tls-cert", tls_cert, "--tls-key", tls_key]
    # a port below 1024 needs this one capability; otherwise none at all
    caps = "CAP_NET_BIND_SERVICE" if port < 1024 else ""
    return service_unit(
        description="gpufleet control plane (REST API, ingest, lifecycle, dashboard)",
        after="postgresql.service",
        user=user,
        # GPUFLEET_DB_URL=postgresql://... and GPUFLEET_PROMETHEUS_URL=http://...: mode 0600
        env_file=env_file,
        argv=args,
        settings=[
            "TimeoutStopSec=30",
            "LimitNOFILE=65536",
            *HARDENING,
            *([f"AmbientCapabilities={caps}"] if caps else []),
            f"CapabilityBoundingSet={caps}",
            f"ReadWritePaths={data_dir}",
        ],
        state_dir=data_dir,
    )


def register_config(config_app: typer.Typer) -> None:
    """Attach `gpufleet config controller-systemd`."""

    @config_app.command("controller-systemd")
    def controller_systemd(
        exec_path: str = typer.Option("/usr/local/bin/gpufleet", "--exec", help="gpufleet path."),
        host: str = typer.Option("0.0.0.0", "--host", help="Address to listen on."),
        port: int = typer.Option(8080, "--port", help="TCP port."),
        env_file: str = typer.Option(
            ENV_FILE,
            "--env-file",
            help="File (mode 0600) with GPUFLEET_DB_URL=... and GPUFLEET_PROMETHEUS_URL=...",
        ),
        data_dir: str = typer.Option(DATA_DIR, "--data-dir", help="SQLite database directory."),
        user: str = typer.Option("gpufleet", "--user", help="Service user."),
        scheduler: str = typer.Option("embedded", "--scheduler", help="Scheduler backend."),
        policy: str | None = typer.Option(None, "--policy", help="Remediation policy YAML."),
        tls_cert: str | None = typer.Option(None, "--tls-cert", help="PEM certificate."),
        tls_key: str | None = typer.Option(None, "--tls-key", help="PEM key of --tls-cert."),
        json_out: bool = JsonOption,
    ) -> None:
        """Print a systemd unit for the control plane (install as gpufleet-controller.service)."""
        text = controller_unit(
            exec_path=exec_path,
            host=host,
            port=port,
            env_file=env_file,
            data_dir=data_dir,
            user=user,
            scheduler=scheduler,
            policy=policy,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        if json_out:
            emit_json({"name": "gpufleet-controller.service", "unit": text, "env": ENV_KEYS})
        else:
            typer.echo(text, nl=False)
