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

from gpufleet.agent.wire import Batch, WireCommand


class SlowScheduler:
    """Today's `SchedulerHook` (drain/resume/lost/is_idle) plus the ingest side of the jobs
    facade (``exchange``); ``drain``, ``is_idle`` and ``exchange`` take ``delay_s`` each, and
    it records what is in flight."""

    name = "slow"

    def __init__(self, delay_s: float) -> None:
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

    def drain(self, node: str, reason: str) -> None:
        self._slow("drain")

    def resume(self, node: str) -> None:
        pass  # fast: every node entering service resumes; the drain is what is slow

    def lost(self, node: str) -> None:
        pass

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

    from gpufleet.control.api import create_app
    from gpufleet.control.service import ControlService, ServiceConfig

    service = ControlService(ServiceConfig(data_dir=data_dir, tick_s=0.2, min_drain_s=0.0))
    slow = SlowScheduler(delay_s)
    service.set_hook(slow)
    service.jobs = slow  # type: ignore[assignment]  # only its exchange is called here
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
