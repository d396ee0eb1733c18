"""`gpufleet up`: control plane, dashboard, the real agent of every node and the embedded
scheduler in one process, with simulated nodes' racks from the fleet file."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.cli.output import console, emit_json, err_console

if TYPE_CHECKING:
    from gpufleet.schedulers.base import SchedulerBackend
    from gpufleet.tls import TlsFiles

from gpufleet.cli.controller_common import _controller_lock, _data_dir, _db_url


def run_up(
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
    *,
    notify: Path | None = None,
) -> None:

    from gpufleet.agent.fleet import (
        FleetConfig,
        FleetDriver,
        job_runners,
        open_backends,
        sim_reloader,
    )
    from gpufleet.cli.process import check_gpu_limit, private_state
    from gpufleet.control.service import ControlService, ServiceConfig
    from gpufleet.control.state.remediation import load_policy
    from gpufleet.control.up import (
        ADMIN_TOKEN_FILE,
        DEFAULT_SIM,
        StateWatcher,
        admin_token,
        node_agent_tokens,
        serve,
    )
    from gpufleet.schedulers.base import Feature
    from gpufleet.tls import pinned_verify

    notifier = None
    if notify is not None:  # a clear error naming the file before anything is opened
        from gpufleet.control.notify.config import load_notify
        from gpufleet.control.notify.durable import OutboxNotifier
        from gpufleet.control.notify.notifier import build_notifier, database_id

        notifier = build_notifier(load_notify(notify), str(notify))
    private_state(_data_dir(data_dir))
    lock = _controller_lock(data_dir, db_url)
    config = ServiceConfig(
        data_dir=_data_dir(data_dir), db_url=_db_url(db_url), policy=load_policy(policy)
    )
    service = ControlService(config, scheduler=scheduler)
    outbox: Any = None  # OutboxNotifier, with --notify
    if notifier is not None:  # as `gpufleet controller --notify` (docs/alerts.md)
        # issue 29: a durable outbox in the database, delivered by a lane per receiver
        outbox = OutboxNotifier(notifier, service.engine, database_id(service.url)).start()
        service.store.tell(outbox)
    service.start(api=True)
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
        # after an update a simulated node's agent reopens with the versions its fleet file
        # now holds (the simulator's update command rewrote it)
        before_reopen=sim_reloader(sim, simfleet),
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
        if outbox is not None:
            outbox.stop()
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
