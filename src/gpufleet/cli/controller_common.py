"""What the control-plane commands share: the data directory and database options, the
per-data-directory lock, the local admin principal, TLS files and the scheduler backend."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.control.api.slow_clients import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from gpufleet.control.state.limits import DEFAULT_MAX_NODES_PER_TOKEN

if TYPE_CHECKING:
    from gpufleet.control.state.auth import Principal
    from gpufleet.control.state.store import ControlStore
    from gpufleet.schedulers.base import SchedulerBackend
    from gpufleet.tls import TlsFiles


DATA_DIR_HELP = "Where the SQLite database lives (default ~/.local/share/gpufleet)."
DB_URL_HELP = "Database URL instead of SQLite, e.g. postgresql://user@host/db (psycopg 3)."


def _data_dir(value: Path | None) -> Path:
    from gpufleet.control.up import DEFAULT_DATA_DIR

    return value or Path(os.environ.get("GPUFLEET_DATA_DIR", DEFAULT_DATA_DIR))


def _db_url(value: str | None) -> str | None:
    return value or os.environ.get("GPUFLEET_DB_URL") or None


DataDirOption = typer.Option(None, "--data-dir", help=DATA_DIR_HELP)
SchedulerOption = typer.Option(
    "embedded",
    "--scheduler",
    help="embedded (jobs run by the agents), slurm, kubernetes, or none.",
)
SlurmConfOption = typer.Option(
    None, "--slurm-conf", help="slurm.conf for --scheduler slurm (default: Slurm's own)."
)
KubeconfigOption = typer.Option(
    None,
    "--kubeconfig",
    help="kubeconfig for --scheduler kubernetes (default: in-cluster, then ~/.kube/config).",
)
DbUrlOption = typer.Option(None, "--db-url", help=DB_URL_HELP)
MaxNodesOption = typer.Option(
    DEFAULT_MAX_NODES_PER_TOKEN,
    "--max-nodes-per-token",
    min=0,
    help="Nodes one agent token not bound to a node may push for (0: no limit).",
)
EnergyRetentionOption = typer.Option(
    400.0,
    "--energy-retention-days",
    min=1.0,
    help="How long per-GPU energy minutes are kept (one row per GPU per minute; reports and "
    "`gpufleet energy report --since` reach back this far).",
)
NotifyOption = typer.Option(
    None,
    "--notify",
    help="Notifications YAML: webhooks (HMAC-signed, or Slack) and email on node state "
    "changes, circuit breaker, failed validations (docs/alerts.md).",
)
HeaderTimeoutOption = typer.Option(
    DEFAULT_HEADER_TIMEOUT_S,
    "--header-timeout",
    min=0.1,
    help="Seconds a client has to send a whole request head; slower connections are closed "
    "(slowloris; docs/security.md).",
)
MaxConnectionsOption = typer.Option(
    DEFAULT_MAX_CONNECTIONS,
    "--max-connections",
    min=1,
    help="Open client connections at most; one past it is answered 503 and closed.",
)
LeaseOption = typer.Option(
    6.0,
    "--lease-seconds",
    min=0.2,
    help="Replicas on one PostgreSQL: the leader's lease; another replica leads at most "
    "lease + renew seconds after the leader dies (docs/control-plane.md, High availability).",
)
RenewOption = typer.Option(
    2.0,
    "--renew-seconds",
    min=0.05,
    help="How often each replica renews or tries to take the lease (less than the lease).",
)
PrometheusOption = typer.Option(
    None,
    "--prometheus-url",
    envvar="GPUFLEET_PROMETHEUS_URL",
    help="Read the series API and the dashboard's charts from this Prometheus "
    "(http://HOST:9090) instead of the controller's memory.",
)

AdvertiseOption = typer.Option(
    None,
    "--advertise-url",
    envvar="GPUFLEET_ADVERTISE_URL",
    help="Replicas without --prometheus-url: this replica's URL as the others reach it "
    "(http://HOST:PORT); they forward raw series reads of the nodes it ingests here.",
)
PeerCaOption = typer.Option(
    None,
    "--peer-ca",
    envvar="GPUFLEET_PEER_CA",
    help="PEM CA bundle (or directory) to verify the other replicas' https:// --advertise-url "
    "with (default: the system trust store).",
)


def _open_store(data_dir: Path | None, db_url: str | None) -> ControlStore:
    from gpufleet.cli.process import private_state
    from gpufleet.control.db.engine import database_url, make_engine
    from gpufleet.control.db.upgrade import migrate_with_backup
    from gpufleet.control.state.store import ControlStore

    private_state()  # the database (and its WAL) this may create are private
    url = database_url(_data_dir(data_dir), _db_url(db_url))
    engine = make_engine(url)
    migrate_with_backup(engine, url, _data_dir(data_dir))  # an older one is backed up first
    import time

    return ControlStore(engine, clock=time.time)


def _controller_lock(data_dir: Path | None, db_url: str | None) -> contextlib.ExitStack:
    """One controller per SQLite database: hold the data directory's lock until closed (a
    second controller, or a restore, on the same directory then stops with a clear error).
    PostgreSQL needs none here (several replicas are the HA issue's design)."""
    from gpufleet.control.db.backup import controller_lock

    stack = contextlib.ExitStack()
    if not _db_url(db_url):
        stack.enter_context(controller_lock(_data_dir(data_dir), what="gpufleet controller"))
    return stack


def _local_admin() -> Principal:
    from gpufleet.control.state.auth import Principal, Role

    return Principal(None, f"local-cli:{os.environ.get('USER', 'unknown')}", Role.ADMIN)


def _tls(cert: Path | None, key: Path | None) -> TlsFiles | None:
    from gpufleet.tls import TlsFiles

    return TlsFiles.from_options(cert, key)


def _scheduler(name: str, slurm_conf: str | None, kubeconfig: str | None) -> SchedulerBackend:
    """The backend registered as ``name`` (an unknown name: a usage error naming --scheduler)."""
    from gpufleet.schedulers.registry import SchedulerOptions, make_scheduler

    return make_scheduler(name, SchedulerOptions(slurm_conf=slurm_conf, kubeconfig=kubeconfig))
