"""The control-plane side of `gpufleet up`: building the service, its session tokens, serving
the app, and the seam where the embedded scheduler plugs in. The agents of `up` (this
machine's GPUs, else a simulated fleet) are real `gpufleet.agent` agents run by
`gpufleet.agent.fleet.FleetDriver`, pushing over loopback HTTP through the same ingest path as
remote agents; the CLI wires the two together.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.schedulers.base import SchedulerBackend

log = logging.getLogger("gpufleet.up")
DEFAULT_SIM = "4x8xh100-sxm"
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "gpufleet"


UP_TOKEN_PREFIX = "up-"  # tokens `gpufleet up` makes for itself; replaced at every start


def revoke_previous_up_tokens(service: ControlService) -> int:
    """Revoke the admin and local-agent tokens earlier `gpufleet up` runs created, so a data
    directory does not collect valid tokens nobody holds any more. Tokens made with
    `gpufleet token create` are left alone. Returns how many were revoked."""
    n = 0
    for row in service.store.tokens.list():
        if row.revoked_s is None and (row.name or "").startswith(UP_TOKEN_PREFIX):
            n += int(service.store.tokens.revoke(row.id))
    return n


def admin_token(service: ControlService) -> str:
    """A fresh admin token for this session (printed once); earlier `up` tokens are revoked."""
    revoke_previous_up_tokens(service)
    token, _ = service.store.tokens.create("admin", name=f"{UP_TOKEN_PREFIX}{int(time.time())}")
    return token


def serve(service: ControlService, host: str, port: int, *, on_ready: Callable[[], None]) -> None:
    """Run uvicorn on the app until Ctrl-C; ``on_ready`` runs once the socket is listening."""
    import uvicorn

    from gpufleet.control.api import create_app

    app = create_app(service)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)

    def on_term(signum: int, frame: object) -> None:
        server.should_exit = True  # also when it comes before uvicorn listens

    # uvicorn re-raises the signal that stopped it once its own shutdown is done: with this
    # handler a SIGTERM ends `run` normally, so the caller stops its agents and the service in
    # order (the default action would kill the process there and then)
    prev = None
    if threading.current_thread() is threading.main_thread():
        prev = signal.signal(signal.SIGTERM, on_term)

    def watch() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            service.store.begin_grace()  # agents can reach it from now: their grace starts
            on_ready()

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.run()
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def build_service(
    data_dir: Path | None,
    db_url: str | None,
    *,
    scheduler: SchedulerBackend | None = None,
    **kw: object,
) -> ControlService:
    """The controller with ``scheduler`` (from `gpufleet.schedulers.registry`) plugged in."""
    cfg = ServiceConfig(data_dir=data_dir, db_url=db_url, **kw)  # type: ignore[arg-type]
    return ControlService(cfg, scheduler=scheduler)
