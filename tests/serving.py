"""An ASGI app served by uvicorn on loopback in a daemon thread: the dashboard, CLI and
sim-fleet tests that need a real HTTP server."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from gpufleet.testing.testbed import free_port
from tests.waiting import wait_until


@contextlib.contextmanager
def serve_app(app: Any, **config: Any) -> Iterator[int]:
    """``app`` served by uvicorn (warnings only, no lifespan, ``config`` on top) on a free
    loopback port, yielded once the server has started; shut down and joined at the end."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", **config
        )
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        assert wait_until(lambda: server.started, 20), "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        th.join(timeout=10)
