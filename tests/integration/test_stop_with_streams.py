"""A controller stopped (SIGTERM, as systemd stops it) while dashboards hold its event stream
open: before, uvicorn's graceful shutdown waited for every request in flight, and a stream
ends only when its client leaves, so a controller with a dashboard tab open never exited (ten
minutes by hand, until the tab closed; under systemd, the SIGKILL after TimeoutStopSec, and
the final rollup flush lost). Now the streams end when the shutdown begins and the process
exits by itself, cleanly."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.timescale import scaled
from tests.waiting import wait_truthy

pytestmark = pytest.mark.process


def test_sigterm_with_open_event_streams_exits_by_itself(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = create_tokens(data, {"admin": ("admin", None), "viewer": ("viewer", None)})
    ctl = ControllerProcess(data, tokens["admin"], scheduler="none").start()
    ended: list[str] = []
    opened = threading.Semaphore(0)

    def watch() -> None:
        headers = {"Authorization": f"Bearer {tokens['viewer']}"}
        try:
            with httpx.stream(
                "GET", f"{ctl.url}/api/v1/stream", headers=headers, timeout=None
            ) as r:
                opened.release()
                for _ in r.iter_lines():
                    pass
            ended.append("ended")
        except httpx.HTTPError as exc:
            ended.append(type(exc).__name__)

    readers = [threading.Thread(target=watch, daemon=True) for _ in range(3)]
    for t in readers:
        t.start()
    for _ in readers:
        assert opened.acquire(timeout=scaled(30)), "a stream did not open"
    assert ctl.proc is not None
    ctl.proc.send_signal(signal.SIGTERM)
    try:
        code = ctl.proc.wait(timeout=scaled(30))
    except Exception:
        ctl.kill9()
        raise AssertionError("the controller did not exit with its event streams open") from None
    assert code == 0
    wait_truthy(lambda: len(ended) == 3, 10, "the streams' clients saw them end")
    assert ended == ["ended"] * 3  # ended by the server, not broken
    log = "\n".join(p.read_text(errors="replace") for p in data.glob("controller-*.log"))
    assert "Traceback" not in log
