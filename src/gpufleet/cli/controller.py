"""`gpufleet controller [serve|migrate|backup|restore]`, `gpufleet token ...`, `gpufleet up` and
`gpufleet sim-fleet`: the control plane and its companions (the commands are registered here;
tokens, backups and `up` live in their own modules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli.common import JsonOption, SeedOption, TokenFileOption, read_token
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json
from gpufleet.cli.process import CaOption, TlsCertOption, TlsKeyOption
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.control.service import ServiceConfig
    from gpufleet.schedulers.base import SchedulerBackend
    from gpufleet.tls import TlsFiles

from gpufleet.cli.controller_common import (
    AdvertiseOption,
    DataDirOption,
    DbUrlOption,
    EnergyRetentionOption,
    HeaderTimeoutOption,
    KubeconfigOption,
    LeaseOption,
    MaxConnectionsOption,
    MaxNodesOption,
    NotifyOption,
    PeerCaOption,
    PrometheusOption,
    RenewOption,
    SchedulerOption,
    SlurmConfOption,
    _controller_lock,
    _data_dir,
    _db_url,
    _scheduler,
    _tls,
)

HostOption = typer.Option("127.0.0.1", "--host", help="Address to listen on.")
PortOption = typer.Option(8080, "--port", help="TCP port.")
# Serves the control plane on (data_dir, db_url, host, port, json_out): what `serve_options` gives
Serve = Callable[[Path | None, str | None, str, int, bool], None]


def serve_options(
    policy: Path | None = typer.Option(None, "--policy", help="Remediation policy YAML."),
    notify: Path | None = NotifyOption,
    scheduler: str = SchedulerOption,
    slurm_conf: str | None = SlurmConfOption,
    kubeconfig: str | None = KubeconfigOption,
    tls_cert: Path | None = TlsCertOption,
    tls_key: Path | None = TlsKeyOption,
    max_nodes: int = MaxNodesOption,
    prometheus_url: str | None = PrometheusOption,
    advertise_url: str | None = AdvertiseOption,
    peer_ca: Path | None = PeerCaOption,
    energy_days: float = EnergyRetentionOption,
    lease_s: float = LeaseOption,
    renew_s: float = RenewOption,
    header_timeout_s: float = HeaderTimeoutOption,
    max_connections: int = MaxConnectionsOption,
) -> Serve:
    """The options `controller` and `controller serve` share (an option group): what serves
    with them. Nothing is checked before it runs (`controller migrate` passes them unused)."""

    def serve(
        data_dir: Path | None, db_url: str | None, host: str, port: int, json_out: bool
    ) -> None:
        config = service_config(
            data_dir, db_url, policy, max_nodes, prometheus_url, advertise_url, peer_ca,
            energy_days, lease_s, renew_s,
        )  # fmt: skip
        tls = _tls(tls_cert, tls_key)
        listen = Listen(host, port, tls, json_out, header_timeout_s, max_connections)
        _serve(config, listen, _scheduler(scheduler, slurm_conf, kubeconfig), notify)

    return serve


def register(app: typer.Typer) -> None:
    """Attach `controller`, `token`, `up` and `sim-fleet`."""
    ctl = typer.Typer(
        help="Run the control plane (REST API, ingest, lifecycle, dashboard).",
        invoke_without_command=True,
        no_args_is_help=False,
    )
    tok = typer.Typer(help="API tokens (stored hashed; shown once).", no_args_is_help=True)
    app.add_typer(ctl, name="controller")
    app.add_typer(tok, name="token")

    @ctl.callback()
    @option_groups(serve=serve_options)
    def controller(
        ctx: typer.Context,
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        host: str = HostOption,
        port: int = PortOption,
        *,
        serve: Serve,
        json_out: bool = JsonOption,
    ) -> None:
        """Serve the control plane (the default when no subcommand is given)."""
        ctx.obj = {"data_dir": data_dir, "db_url": db_url}
        if ctx.invoked_subcommand is None:
            serve(data_dir, db_url, host, port, json_out)

    @ctl.command("serve")
    @option_groups(serve=serve_options)
    def serve_cmd(
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8080, "--port"),
        *,
        serve: Serve,
        json_out: bool = JsonOption,
    ) -> None:
        """Serve the control plane."""
        serve(data_dir, db_url, host, port, json_out)

    @ctl.command("migrate")
    def migrate_cmd(
        ctx: typer.Context,
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Create or upgrade the database schema to the newest revision."""
        from gpufleet.control.db.engine import database_url, make_engine
        from gpufleet.control.db.upgrade import migrate_with_backup

        parent = ctx.parent.obj if ctx.parent and ctx.parent.obj else {}
        ddir = _data_dir(data_dir or parent.get("data_dir"))
        url = database_url(ddir, _db_url(db_url or parent.get("db_url")))
        engine = make_engine(url)
        try:  # an older database is backed up first (docs/control-plane.md, "Upgrading")
            done = migrate_with_backup(engine, url, ddir)
        finally:
            engine.dispose()
        rev, shown = done.revision, url.split("@")[-1] if "@" in url else url
        if json_out:
            emit_json(
                {"database": shown, "revision": rev, "from_revision": done.from_revision}
                | {"backup": done.backup}
            )
        else:
            if done.backup:
                shown_backup = f"backed up revision {done.from_revision} to {done.backup}"
                console.print(shown_backup, highlight=False)
            console.print(f"database {shown} at revision {rev}")

    from gpufleet.cli.controller_backup import register_backup
    from gpufleet.cli.controller_tokens import register_tokens

    register_backup(ctl)
    register_tokens(tok)

    @app.command("up")
    def up(
        sim: str | None = typer.Option(
            None,
            "--sim",
            metavar="SPEC",
            help="Simulated fleet NODESxGPUSxMODEL or YAML (default: real GPUs, else 4x8xh100).",
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        host: str = HostOption,
        port: int = PortOption,
        seed: int = SeedOption,
        scheduler: str = SchedulerOption,
        slurm_conf: str | None = SlurmConfOption,
        policy: Path | None = typer.Option(
            None, "--policy", help="Remediation policy YAML (e.g. min_out_nodes, dry_run)."
        ),
        tls_cert: Path | None = TlsCertOption,
        tls_key: Path | None = TlsKeyOption,
        notify: Path | None = NotifyOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Control plane + local agent (+ embedded scheduler) in one process."""
        tls = _tls(tls_cert, tls_key)
        backend = _scheduler(scheduler, slurm_conf, None)
        from gpufleet.cli.up_run import run_up

        run_up(
            sim, data_dir, db_url, host, port, seed, json_out, policy, backend, tls, notify=notify
        )

    @app.command("sim-fleet")
    def sim_fleet(
        controller_url: str = typer.Option(..., "--controller", help="Control plane URL."),
        token: str | None = typer.Option(
            None,
            "--token",
            envvar="GPUFLEET_TOKEN",
            help="Admin token (one node-bound agent token is made per node) or agent token.",
        ),
        token_file: Path | None = TokenFileOption,
        nodes: int = typer.Option(4, "--nodes", min=1, max=20000),
        gpus_per_node: int = typer.Option(
            8, "--gpus-per-node", min=1, help="At most 16, what the control plane takes."
        ),
        model: str = typer.Option("h100-sxm", "--model", help="GPU model (catalog key)."),
        faults: Path | None = typer.Option(None, "--faults", help="YAML list of faults."),
        duration: float | None = typer.Option(
            None, "--duration", help="Seconds (default: run until Ctrl-C)."
        ),
        sample_interval: float = typer.Option(
            1.0, "--sample-interval", min=0.05, help="Seconds between samples of each node."
        ),
        push_interval: float = typer.Option(2.0, "--push-interval", min=0.1),
        concurrency: int = typer.Option(
            64, "--concurrency", min=1, max=1024, help="HTTP connections to the controller."
        ),
        prefix: str = typer.Option("sim", "--prefix", help="Node name prefix."),
        state_dir: Path | None = typer.Option(
            None,
            "--state-dir",
            help="Agent state (identity, sequence numbers, spool) per node; default: temporary.",
        ),
        run_jobs: bool = typer.Option(
            True, "--run-jobs/--no-run-jobs", help="Run the jobs the controller sends."
        ),
        seed: int = SeedOption,
        ca: Path | None = CaOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Many simulated nodes in one process, each a real agent, pushing over HTTP."""
        from gpufleet.cli.process import private_state
        from gpufleet.cli.simfleet import run_sim_fleet
        from gpufleet.tls import client_verify
        from gpufleet.wire.limits import MAX_GPUS_PER_NODE

        if gpus_per_node > MAX_GPUS_PER_NODE:
            raise UsageError(
                f"--gpus-per-node {gpus_per_node}: the control plane takes at most "
                f"{MAX_GPUS_PER_NODE} GPUs per node"
            )
        private_state(state_dir)

        given = read_token(token, token_file)
        if not given:
            raise UsageError("sim-fleet needs --token-file (or GPUFLEET_TOKEN_FILE, --token)")
        run_sim_fleet(
            controller_url,
            given,
            f"{nodes}x{gpus_per_node}x{model}",
            faults=faults,
            duration=duration,
            sample_interval=sample_interval,
            push_interval=push_interval,
            concurrency=concurrency,
            prefix=prefix,
            state_dir=state_dir,
            run_jobs=run_jobs,
            seed=seed,
            json_out=json_out,
            verify=client_verify(ca),
        )


@dataclass(frozen=True)
class Listen:
    """Where and how the controller's API is served, and how it says so."""

    host: str
    port: int
    tls: TlsFiles | None
    json_out: bool
    header_timeout_s: float  # a request head's deadline (slowloris)
    max_connections: int  # open client connections at most


def service_config(
    data_dir: Path | None,
    db_url: str | None,
    policy: Path | None,
    max_nodes: int,
    prometheus_url: str | None,
    advertise_url: str | None,
    peer_ca: Path | None,
    energy_days: float,
    lease_s: float,
    renew_s: float,
) -> ServiceConfig:
    """The controller's options as one `ServiceConfig`, every one checked before anything is
    opened (a clear error naming the option)."""
    from gpufleet.control.series.forward import check_advertise_url
    from gpufleet.control.series.source import check_url
    from gpufleet.control.service import ServiceConfig
    from gpufleet.control.state.remediation import load_policy

    if not renew_s < lease_s:
        raise UsageError(
            f"--renew-seconds {renew_s:g} must be less than --lease-seconds {lease_s:g}"
        )
    if peer_ca is not None:
        from gpufleet.tls import client_verify

        client_verify(peer_ca, "--peer-ca")
    return ServiceConfig(
        data_dir=_data_dir(data_dir),
        db_url=_db_url(db_url),
        policy=load_policy(policy),
        max_nodes_per_token=max_nodes,
        prometheus_url=check_url(prometheus_url) if prometheus_url else None,
        advertise_url=check_advertise_url(advertise_url) if advertise_url else None,
        peer_ca=peer_ca,
        energy_retention_s=energy_days * 86400.0,
        lease_s=lease_s,
        renew_s=renew_s,
    )


def _serve(
    config: ServiceConfig, listen: Listen, scheduler: SchedulerBackend, notify: Path | None
) -> None:
    from gpufleet.cli.process import private_state
    from gpufleet.control.notify.config import load_notify
    from gpufleet.control.notify.durable import OutboxNotifier
    from gpufleet.control.notify.notifier import build_notifier, database_id
    from gpufleet.control.service import ControlService
    from gpufleet.control.up import serve

    notifier = build_notifier(load_notify(notify), str(notify)) if notify else None
    data_dir, db_url = config.data_dir, config.db_url
    private_state(None if _db_url(db_url) else _data_dir(data_dir))
    lock = _controller_lock(data_dir, db_url)
    service = ControlService(config, scheduler=scheduler)
    outbox: OutboxNotifier | None = None
    if notifier is not None:  # issue 18: webhooks and email on node and breaker events
        # issue 29: a durable outbox in the database, delivered by a lane per receiver
        outbox = OutboxNotifier(notifier, service.engine, database_id(service.url)).start()
        service.store.tell(outbox)
    if service.replicated and not config.prometheus_url and not config.advertise_url:
        import logging

        logging.getLogger("gpufleet.control").warning(
            "no --advertise-url (nor --prometheus-url): other replicas answer raw series of "
            "the nodes pushing here from their own memory, marked partial"
        )
    service.start(api=True)
    host, port, tls = listen.host, listen.port, listen.tls
    url = f"{'https' if tls else 'http'}://{host}:{port}"

    def ready() -> None:
        if listen.json_out:
            emit_json(
                {
                    "url": url,
                    "api": f"{url}/api/v1",
                    "database": service.url.split("@")[-1],
                    "series": "prometheus" if config.prometheus_url else "memory",
                    "advertise_url": config.advertise_url,
                    "energy_retention_days": config.energy_retention_s / 86400.0,
                    "leader": service.leading,
                    "replicated": service.replicated,
                }
            )
        else:
            console.print(  # one line: logs and scripts grep for the URL
                f"gpufleet controller listening on {url} (API {url}/api/v1/docs)",
                highlight=False,
                soft_wrap=True,
            )

    try:
        serve(
            service,
            host,
            port,
            on_ready=ready,
            tls=tls,
            header_timeout_s=listen.header_timeout_s,
            max_connections=listen.max_connections,
        )
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its own clean shutdown
        pass
    finally:
        service.stop()
        if outbox is not None:
            outbox.stop()
        lock.close()
