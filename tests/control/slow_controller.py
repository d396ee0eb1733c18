"""A real controller (uvicorn on loopback, SQLite) whose scheduler answers every call after
``--delay`` seconds: the server side of ``test_slow_scheduler``. Run as a script:

    python tests/control/slow_controller.py DATA_DIR PORT DELAY_S

It writes ``tokens.json`` (admin and agent tokens) into DATA_DIR once it listens.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from gpufleet.schedulers.base import Capabilities, Capability, Feature, NoScheduler
from gpufleet.wire import Batch, WireCommand

SLOW_FEATURES = (Feature.DRAIN, Feature.REPORTS_IDLE, Feature.AGENT_JOBS)


class SlowScheduler(NoScheduler):
    """A scheduler backend (the one protocol) whose ``drain``, ``is_idle`` and ``exchange``
    take ``delay_s`` each; it records what is in flight. Everything else is `NoScheduler`'s."""

    name = "slow"

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.done: list[str] = []

    def _slow(self, what: str) -> None:
        with self.lock:
            self.in_flight[what] = self.in_flight.get(what, 0) + 1
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight[what] -= 1
            self.done.append(what)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            self.name,
            [Capability(f, f in SLOW_FEATURES, "slow test backend") for f in Feature],
        )

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        self._slow("drain")

    def is_idle(self, node: str) -> bool:
        self._slow("is_idle")
        return True

    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        self._slow("exchange")
        return []

    def state(self) -> dict[str, object]:
        with self.lock:
            return {"in_flight": dict(self.in_flight), "done": list(self.done)}


def main(data_dir: Path, port: int, delay_s: float) -> None:
    import uvicorn
    from fastapi import FastAPI

    from gpufleet.control.api.app import create_app
    from gpufleet.control.service import ControlService, ServiceConfig

    slow = SlowScheduler(delay_s)
    service = ControlService(
        ServiceConfig(data_dir=data_dir, tick_s=0.2, min_drain_s=0.0), scheduler=slow
    )
    service.start()
    app: FastAPI = create_app(service)

    @app.get("/test/scheduler")
    def scheduler_state() -> dict[str, object]:
        return slow.state()

    app.router.routes.insert(0, app.router.routes.pop())  # before the dashboard's "/" mount

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started:
            time.sleep(0.05)
        admin, _ = service.store.tokens.create("admin", name="test-admin")
        agent, _ = service.store.tokens.create("agent", name="test-agent")
        tmp = data_dir / "tokens.tmp"
        tmp.write_text(json.dumps({"admin": admin, "agent": agent}))
        tmp.rename(data_dir / "tokens.json")

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        service.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
