"""`gpufleet up`: one process with the control plane, a local agent (this machine's GPUs when
NVML finds them, else a simulated fleet) pushing over loopback HTTP through the same ingest
path as remote agents, and the seam where the embedded scheduler plugs in.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.simfleet import NodePusher, run_fleet
from gpufleet.schedulers.base import SchedulerBackend

log = logging.getLogger("gpufleet.up")
DEFAULT_SIM = "4x8xh100-sxm"
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "gpufleet"


@dataclass
class UpPlan:
    """What `gpufleet up` will run."""

    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = DEFAULT_DATA_DIR
    db_url: str | None = None
    sim: str | None = None
    seed: int = 7
    source: str = "sim"  # "nvml" or "sim", decided by `choose_source`
    faults: list[str] = field(default_factory=list)


def choose_backends(sim: str | None, seed: int) -> tuple[str, list[object], object]:
    """Real GPUs when NVML finds some (and no --sim was given), else the simulated fleet."""
    from gpufleet.devices.discovery import open_local_nvml, open_sim
    from gpufleet.errors import GpufleetError

    if not sim:
        try:
            fleet = open_local_nvml()
            return "nvml", list(fleet.backends), None
        except GpufleetError:
            sim = DEFAULT_SIM
        except Exception:  # a broken driver must not stop the demo from starting
            sim = DEFAULT_SIM
    fleet = open_sim(sim, seed=seed)
    fleet.sim.demo_activity()
    return "sim", list(fleet.backends), fleet.sim


class LocalAgents:
    """The in-process agents of `gpufleet up`: a thread running `run_fleet` against loopback."""

    def __init__(
        self, url: str, token: str, backends: list[object], jobs: dict[str, object] | None = None
    ) -> None:
        self.url = url
        self.token = token
        self.pushers = [NodePusher(b) for b in backends]  # type: ignore[arg-type]
        for p in self.pushers:  # nodes that run the embedded scheduler's jobs (issue 7)
            p.jobs = (jobs or {}).get(p.node)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="gpufleet-local-agents", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        try:
            self._loop.run_until_complete(
                run_fleet(
                    self.url,
                    self.token,
                    self.pushers,
                    duration_s=None,
                    stop=self._stop,
                    gzip_body=False,
                )
            )
        except Exception as exc:
            log.warning("local agents stopped: %s", exc)
        finally:
            self._loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


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

    def watch() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            on_ready()

    threading.Thread(target=watch, daemon=True).start()
    server.run()


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
