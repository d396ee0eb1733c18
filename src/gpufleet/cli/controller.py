"""`gpufleet controller [serve|migrate]`, `gpufleet token create|list|revoke`, `gpufleet up` and
`gpufleet sim-fleet`: the control plane and its companions."""

from __future__ import annotations

import contextlib
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli.common import JsonOption, SeedOption, TokenFileOption, read_token
from gpufleet.cli.output import console, emit_json, err_console
from gpufleet.cli.process import CaOption, TlsCertOption, TlsKeyOption
from gpufleet.control.limits import DEFAULT_MAX_NODES_PER_TOKEN
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.control.auth import Principal
    from gpufleet.control.store import ControlStore
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
NotifyOption = typer.Option(
    None,
    "--notify",
    help="Notifications YAML: webhooks (HMAC-signed, or Slack) and email on node state "
    "changes, circuit breaker, failed validations (docs/alerts.md).",
)
PrometheusOption = typer.Option(
    None,
    "--prometheus-url",
    envvar="GPUFLEET_PROMETHEUS_URL",
    help="Read the series API and the dashboard's charts from this Prometheus "
    "(http://HOST:9090) instead of the controller's memory.",
)


def _open_store(data_dir: Path | None, db_url: str | None) -> ControlStore:
    from gpufleet.cli.process import private_state
    from gpufleet.control.db import database_url, make_engine, migrate
    from gpufleet.control.store import ControlStore

    private_state()  # the database (and its WAL) this may create are private
    engine = make_engine(database_url(_data_dir(data_dir), _db_url(db_url)))
    migrate(engine)
    import time

    return ControlStore(engine, clock=time.time)


def _controller_lock(data_dir: Path | None, db_url: str | None) -> contextlib.ExitStack:
    """One controller per SQLite database: hold the data directory's lock until closed (a
    second controller, or a restore, on the same directory then stops with a clear error).
    PostgreSQL needs none here (several replicas are the HA issue's design)."""
    from gpufleet.control.backup import controller_lock

    stack = contextlib.ExitStack()
    if not _db_url(db_url):
        stack.enter_context(controller_lock(_data_dir(data_dir), what="gpufleet controller"))
    return stack


def _local_admin() -> Principal:
    from gpufleet.control.auth import Principal, Role

    return Principal(None, f"local-cli:{os.environ.get('USER', 'unknown')}", Role.ADMIN)


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
    def controller(
        ctx: typer.Context,
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8080, "--port", help="TCP port."),
        policy: Path | None = typer.Option(None, "--policy", help="Remediation policy YAML."),
        notify: Path | None = NotifyOption,
        scheduler: str = SchedulerOption,
        slurm_conf: str | None = SlurmConfOption,
        kubeconfig: str | None = KubeconfigOption,
        tls_cert: Path | None = TlsCertOption,
        tls_key: Path | None = TlsKeyOption,
        max_nodes: int = MaxNodesOption,
        prometheus_url: str | None = PrometheusOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Serve the control plane (the default when no subcommand is given)."""
        ctx.obj = {"data_dir": data_dir, "db_url": db_url}
        if ctx.invoked_subcommand is None:
            tls = _tls(tls_cert, tls_key)
            backend = _scheduler(scheduler, slurm_conf, kubeconfig)
            _serve(
                data_dir,
                db_url,
                host,
                port,
                policy,
                json_out,
                backend,
                tls,
                max_nodes,
                notify,
                prometheus_url,
            )

    @ctl.command("serve")
    def serve_cmd(
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8080, "--port"),
        policy: Path | None = typer.Option(None, "--policy", help="Remediation policy YAML."),
        notify: Path | None = NotifyOption,
        scheduler: str = SchedulerOption,
        slurm_conf: str | None = SlurmConfOption,
        kubeconfig: str | None = KubeconfigOption,
        tls_cert: Path | None = TlsCertOption,
        tls_key: Path | None = TlsKeyOption,
        max_nodes: int = MaxNodesOption,
        prometheus_url: str | None = PrometheusOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Serve the control plane."""
        tls = _tls(tls_cert, tls_key)
        backend = _scheduler(scheduler, slurm_conf, kubeconfig)
        _serve(
            data_dir,
            db_url,
            host,
            port,
            policy,
            json_out,
            backend,
            tls,
            max_nodes,
            notify,
            prometheus_url,
        )

    @ctl.command("migrate")
    def migrate_cmd(
        ctx: typer.Context,
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Create or upgrade the database schema to the newest revision."""
        from gpufleet.control.db import database_url, make_engine, migrate

        parent = ctx.parent.obj if ctx.parent and ctx.parent.obj else {}
        url = database_url(
            _data_dir(data_dir or parent.get("data_dir")), _db_url(db_url or parent.get("db_url"))
        )
        engine = make_engine(url)
        rev = migrate(engine)
        engine.dispose()
        shown = url.split("@")[-1] if "@" in url else url
        if json_out:
            emit_json({"database": shown, "revision": rev})
        else:
            console.print(f"database {shown} at revision {rev}")

    def _url_and_dir(
        ctx: typer.Context, data_dir: Path | None, db_url: str | None
    ) -> tuple[str, Path | None]:
        from gpufleet.control.db import database_url

        parent = ctx.parent.obj if ctx.parent and ctx.parent.obj else {}
        url_opt = _db_url(db_url or parent.get("db_url"))
        ddir = _data_dir(data_dir or parent.get("data_dir"))
        return database_url(None if url_opt else ddir, url_opt), ddir

    @ctl.command("backup")
    def backup_cmd(
        ctx: typer.Context,
        to: Path = typer.Option(
            ..., "--to", help="The backup file to write (0600).", metavar="FILE"
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Back up the database and key files, safely while the controller runs."""
        from gpufleet.control.backup import backup
        from gpufleet.control.db import current_revision, make_engine

        url, ddir = _url_and_dir(ctx, data_dir, db_url)
        engine = make_engine(url)
        try:
            rev = current_revision(engine)
        finally:
            engine.dispose()
        info = backup(url, ddir, to, rev)
        if json_out:
            emit_json(info.__dict__)
        else:
            console.print(
                f"backed up {info.database} database (revision {info.revision}) and "
                f"{len(info.members) - 1} key file(s) to {info.path} ({info.bytes:,} bytes)",
                highlight=False,
            )

    @ctl.command("restore")
    def restore_cmd(
        ctx: typer.Context,
        source: Path = typer.Argument(
            ..., help="A file written by `controller backup`.", metavar="FILE"
        ),
        force: bool = typer.Option(False, "--force", help="Replace a database that holds nodes."),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Restore a backup (the controller must be stopped), then migrate to this version."""
        from gpufleet.control.backup import restore
        from gpufleet.control.db import make_engine, migrate

        url, ddir = _url_and_dir(ctx, data_dir, db_url)
        manifest = restore(source, url, ddir, force=force)
        engine = make_engine(url)
        try:
            rev = migrate(engine)
        finally:
            engine.dispose()
        if json_out:
            emit_json(
                {
                    "restored": str(source),
                    "from_revision": manifest.get("revision"),
                    "revision": rev,
                    "created_s": manifest.get("created_s"),
                }
            )
        else:
            console.print(
                f"restored {source} (taken at revision {manifest.get('revision')}); database now "
                f"at revision {rev}",
                highlight=False,
            )

    @tok.command("create")
    def token_create(
        role: str | None = typer.Option(
            None, "--role", help="admin, operator, viewer or agent (agent with --node)."
        ),
        name: str = typer.Option("", "--name", help="A label shown in lists."),
        tenant: str | None = typer.Option(None, "--tenant", help="Bind to a tenant."),
        node: str | None = typer.Option(
            None, "--node", help="Agent token for one node (implies --role agent)."
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="Write the token to this file (mode 0600) instead of printing it; give the "
            "file to --token-file.",
            metavar="FILE",
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Create a token and print it once (only its hash is stored), or write it to --out."""
        from gpufleet.control import actions
        from gpufleet.control.up import write_secret

        if node is not None and role not in (None, "agent"):
            raise UsageError("--node makes an agent token: use --role agent with it")
        if role is None:
            if node is None:
                raise UsageError("token create needs --role (admin, operator, viewer or agent)")
            role = "agent"
        store = _open_store(data_dir, db_url)
        token, tid = actions.create_token(store, _local_admin(), role, name, tenant, node)
        store.engine.dispose()
        if out is not None:
            try:
                write_secret(out.expanduser(), token)
            except OSError as exc:
                raise UsageError(f"--out {out}: {exc.strerror}") from exc
            token = f"written to {out}"
        if json_out:
            emit_json({"id": tid, "role": role, "tenant": tenant, "node": node, "token": token})
        elif out is not None:
            console.print(f"token {tid} ({role}) {token} (mode 0600)", highlight=False)
        else:
            console.print(f"token {tid} ({role}): [bold]{token}[/]", highlight=False)
            err_console.print("Store it now: it is not shown again.")

    @tok.command("list")
    def token_list(
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """List tokens (prefix, role, tenant, node; never the token)."""
        from rich.table import Table

        store = _open_store(data_dir, db_url)
        rows = store.tokens.list()
        store.engine.dispose()
        data = [
            {
                "id": r.id,
                "name": r.name,
                "prefix": r.prefix,
                "role": r.role,
                "tenant": r.tenant,
                "node": r.node,
                "owner": r.owner,
                "created_s": r.created_s,
                "revoked_s": r.revoked_s,
            }
            for r in rows
        ]
        if json_out:
            emit_json(data)
            return
        table = Table("id", "name", "prefix", "role", "tenant", "node", "revoked")
        for d in data:
            table.add_row(
                str(d["id"]),
                str(d["name"]),
                f"{d['prefix']}…",
                str(d["role"]),
                str(d["tenant"] or ""),
                str(d["node"] or ""),
                "yes" if d["revoked_s"] else "",
            )
        console.print(table)

    @tok.command("revoke")
    def token_revoke(
        token_id: int = typer.Argument(..., help="Token id (see `gpufleet token list`)."),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Revoke a token (every running controller refuses it within a second)."""
        from gpufleet.control import actions
        from gpufleet.control.store import NotFound

        store = _open_store(data_dir, db_url)
        try:
            actions.revoke_token(store, _local_admin(), token_id)
        except NotFound as exc:
            raise UsageError(str(exc)) from exc
        finally:
            store.engine.dispose()
        if json_out:
            emit_json({"id": token_id, "revoked": True})
        else:
            console.print(f"token {token_id} revoked")

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
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8080, "--port", help="TCP port."),
        seed: int = SeedOption,
        scheduler: str = SchedulerOption,
        slurm_conf: str | None = SlurmConfOption,
        policy: Path | None = typer.Option(
            None, "--policy", help="Remediation policy YAML (e.g. min_out_nodes, dry_run)."
        ),
        tls_cert: Path | None = TlsCertOption,
        tls_key: Path | None = TlsKeyOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Control plane + local agent (+ embedded scheduler) in one process."""
        tls = _tls(tls_cert, tls_key)
        backend = _scheduler(scheduler, slurm_conf, None)
        _up(sim, data_dir, db_url, host, port, seed, json_out, policy, backend, tls)

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


def _tls(cert: Path | None, key: Path | None) -> TlsFiles | None:
    from gpufleet.tls import TlsFiles

    return TlsFiles.from_options(cert, key)


def _scheduler(name: str, slurm_conf: str | None, kubeconfig: str | None) -> SchedulerBackend:
    """The backend registered as ``name`` (an unknown name: a usage error naming --scheduler)."""
    from gpufleet.schedulers.registry import SchedulerOptions, make_scheduler

    return make_scheduler(name, SchedulerOptions(slurm_conf=slurm_conf, kubeconfig=kubeconfig))


def _serve(
    data_dir: Path | None,
    db_url: str | None,
    host: str,
    port: int,
    policy: Path | None,
    json_out: bool,
    scheduler: SchedulerBackend,
    tls: TlsFiles | None = None,
    max_nodes: int = DEFAULT_MAX_NODES_PER_TOKEN,
    notify: Path | None = None,
    prometheus_url: str | None = None,
) -> None:
    from gpufleet.cli.process import private_state
    from gpufleet.control.notify import attach, build_notifier, database_id
    from gpufleet.control.notify_config import load_notify
    from gpufleet.control.remediation import load_policy
    from gpufleet.control.series_source import check_url
    from gpufleet.control.up import build_service, serve

    notifier = build_notifier(load_notify(notify), str(notify)) if notify else None
    prometheus_url = check_url(prometheus_url) if prometheus_url else None

    private_state(None if _db_url(db_url) else _data_dir(data_dir))
    lock = _controller_lock(data_dir, db_url)
    service = build_service(
        _data_dir(data_dir),
        _db_url(db_url),
        scheduler=scheduler,
        policy=load_policy(policy),
        max_nodes_per_token=max_nodes,
    )
    if notifier is not None:  # issue 18: webhooks and email on node and breaker events
        attach(service.store.sessions, notifier.start(), database_id(service.url))
    service.config.prometheus_url = prometheus_url  # read when the API is built (serve)
    service.start()
    url = f"{'https' if tls else 'http'}://{host}:{port}"

    def ready() -> None:
        if json_out:
            emit_json(
                {
                    "url": url,
                    "api": f"{url}/api/v1",
                    "database": service.url.split("@")[-1],
                    "series": "prometheus" if prometheus_url else "memory",
                }
            )
        else:
            console.print(  # one line: logs and scripts grep for the URL
                f"gpufleet controller listening on {url} (API {url}/api/v1/docs)",
                highlight=False,
                soft_wrap=True,
            )

    try:
        serve(service, host, port, on_ready=ready, tls=tls)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its own clean shutdown
        pass
    finally:
        service.stop()
        if notifier is not None:
            notifier.stop()
        lock.close()


def _up(
    sim: str | None,
    data_dir: Path | None,
    db_url: str | None,
    host: str,
    port: int,
    seed: int,
    json_out: bool,
    policy: Path | None,
    scheduler: SchedulerBackend,
    tls: TlsFiles | None = None,
) -> None:

    from gpufleet.agent.fleet import FleetConfig, FleetDriver, job_runners, open_backends
    from gpufleet.cli.process import check_gpu_limit, private_state
    from gpufleet.control.remediation import load_policy
    from gpufleet.control.up import (
        ADMIN_TOKEN_FILE,
        DEFAULT_SIM,
        StateWatcher,
        admin_token,
        build_service,
        node_agent_tokens,
        serve,
    )
    from gpufleet.schedulers.base import Feature
    from gpufleet.tls import pinned_verify

    private_state(_data_dir(data_dir))
    lock = _controller_lock(data_dir, db_url)
    service = build_service(
        _data_dir(data_dir), _db_url(db_url), scheduler=scheduler, policy=load_policy(policy)
    )
    service.start()
    token = admin_token(service, _data_dir(data_dir))
    source, backends, simfleet = open_backends(sim, seed, DEFAULT_SIM)
    check_gpu_limit(backends, "--sim")
    # one agent token per node, bound to it: only those may offer job slots
    node_tokens = node_agent_tokens(service, [b.node_name for b in backends])
    scheme = "https" if tls else "http"
    url = f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    jobs = {}
    if scheduler.capabilities().supports(Feature.AGENT_JOBS):
        jobs = job_runners(backends, simfleet, _data_dir(data_dir) / "jobs")
    # the real agent for every node (sampler, health, spool, push, jobs), a few threads in all
    agents = FleetDriver(
        backends,
        FleetConfig(
            controller=url,
            token="",
            tokens=node_tokens,
            state_dir=_data_dir(data_dir) / "agents",
            fast_interval_s=1.0,
            # agents running jobs exchange every second (commands out, outcomes back: see
            # `gpufleet.agent.jobs.DEFAULT_EXCHANGE_S`); liveness is still judged on 2 s
            push_interval_s=1.0 if jobs else 2.0,
            heartbeat_interval_s=2.0,
            # the agents reach their own listener on loopback: trust exactly its certificate
            verify=pinned_verify(tls.cert) if tls else True,
        ),
        jobs=jobs,
    )

    def ready() -> None:
        agents.start()
        if simfleet is not None:
            racks = rack_names(sim_nodes(simfleet))
            _assign_racks(url, token, racks, ca=pinned_verify(tls.cert) if tls else None)
        info = {
            "url": url,
            "dashboard": f"{url}/#token={token}",
            "admin_token": token,
            "admin_token_file": str(_data_dir(data_dir) / ADMIN_TOKEN_FILE),
            "source": source,
            "nodes": len(backends),
            "database": service.url.split("@")[-1],
        }
        if json_out:
            emit_json(info)
        else:
            what = (
                "this machine's GPUs"
                if source == "nvml"
                else f"a simulated fleet ({sim or 'default 4x8xh100-sxm'})"
            )
            console.print(f"gpufleet is up with {what}", highlight=False)
            console.print(f"  dashboard: {info['dashboard']}", highlight=False, soft_wrap=True)
            console.print(f"  API:       {url}/api/v1/docs", highlight=False)
            console.print(f"  admin token: {token}", highlight=False, soft_wrap=True)
            console.print(
                f"  token file:  {info['admin_token_file']} (use --token-file)", highlight=False
            )
            console.print("Ctrl-C stops. Node states as they change:", highlight=False)
            watcher.start()  # new nodes: validating -> in_service once their agent validated

    watcher = StateWatcher(
        service, lambda line: console.print(line, highlight=False, soft_wrap=True)
    )

    def last_push() -> None:  # on SIGINT/SIGTERM, while the server still answers
        agents.stop(flush=True, close_wait_s=0.5)

    try:
        serve(service, host, port, on_ready=ready, before_exit=last_push, tls=tls)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its own clean shutdown
        pass
    finally:
        watcher.stop()
        agents.stop(flush=False, close_wait_s=0.5)  # (done already after a stop signal)
        service.stop()
        lock.close()
        if not json_out:
            err_console.print("gpufleet stopped")


def sim_nodes(simfleet: Any) -> list[Any]:
    return list(simfleet.spec.nodes)


def rack_names(nodes: list[Any], per_rack: int = 16) -> dict[str, str]:
    """Each simulated node's rack: the fleet file's ``rack:`` where it gives one, else r00,
    r01, ... of ``per_rack`` nodes in order."""
    return {n.name: n.rack or f"r{i // per_rack:02d}" for i, n in enumerate(nodes)}


def _assign_racks(
    url: str,
    token: str,
    racks: dict[str, str],
    ca: ssl.SSLContext | None = None,
) -> None:
    """Give simulated nodes their racks (`rack_names`) once they registered."""
    import threading
    import time

    from gpufleet.client import ApiError, Client
    from gpufleet.errors import GpufleetError

    def work() -> None:
        pending = dict(racks)
        deadline = time.monotonic() + 30
        with Client(url, token, timeout_s=5.0, ca=ca) as client:
            while pending and time.monotonic() < deadline:
                for n, rack in list(pending.items()):
                    try:
                        client.set_node(n, rack=rack)
                    except ApiError:  # not registered yet
                        continue
                    except GpufleetError:  # the server is stopping
                        return
                    del pending[n]
                time.sleep(0.5)

    threading.Thread(target=work, daemon=True).start()
