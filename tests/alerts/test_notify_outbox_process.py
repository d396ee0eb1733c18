"""Issue 29 end to end: a real ``gpufleet controller --notify`` process makes 20 notifications
while its webhook answers HTTP 500, is killed with ``kill -9`` while one attempt is in the
receiver's hands, and restarted with the receiver healthy: every notification arrives, by its
id, and the only repeat is the one that was in flight at the kill. ``gpufleet notify status``
and ``GET /api/v1/notifications/status`` tell the story. Before the outbox the notifications
waited in the killed process's memory and none of the 20 arrived."""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from tests.control.conftest import batch
from tests.integration.processes import cli
from tests.waiting import wait_truthy, wait_until

pytestmark = pytest.mark.process
COUNT = 20


class Receiver:
    """A webhook that answers 500 (``mode`` "down"), or takes one attempt and holds its answer
    until ``release`` ("hold"), or answers 200 ("up"); ``accepted``: the ids of every attempt
    it kept (a held one too: the receiver has it, the sender never heard so)."""

    def __init__(self) -> None:
        self.mode = "down"
        self.lock = threading.Lock()
        self.seen: list[str] = []
        self.accepted: list[str] = []
        self.held: str | None = None
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                nid = self.headers.get("X-Gpufleet-Id", "")
                with outer.lock:
                    outer.seen.append(nid)
                    mode = outer.mode
                    if mode == "hold" and outer.held is None:
                        outer.held = nid
                    elif mode == "hold":
                        mode = "down"
                    if mode != "down":
                        assert body  # the payload came with it
                        outer.accepted.append(nid)
                if mode == "hold":
                    outer.release.wait(60)
                try:
                    self.send_response(500 if mode == "down" else 200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender is gone (killed)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/s3cr3t-path"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> tuple[list[str], list[str]]:
        with self.lock:
            return list(self.seen), list(self.accepted)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _status(ctl: ControllerProcess) -> dict[str, Any]:
    r = ctl.call("GET", "/api/v1/notifications/status")
    assert r.status_code == 200, r.text
    (rx,) = r.json()["receivers"]
    return dict(rx)


def test_notifications_survive_kill_9_and_arrive_by_id(tmp_path: Path) -> None:
    data = tmp_path / "ctl"
    data.mkdir(mode=0o700)
    tokens = create_tokens(data, {"admin": ("admin", None), "agent": ("agent", "n1")})
    rx = Receiver()
    notify = tmp_path / "notify.yaml"
    notify.write_text(
        f"webhooks:\n  - url: {rx.url}\n    events: [validation_failed]\n    timeout_s: 60\n"
        "retry: {attempts: 200, backoff_s: 0.2, max_backoff_s: 1}\n",
        encoding="utf-8",
    )
    ctl = ControllerProcess(data, tokens["admin"], scheduler="none", args=["--notify", str(notify)])
    try:
        ctl.start()
        r = httpx.post(
            f"{ctl.url}/api/v1/ingest",
            json=batch("n1", 1, t=time.time()),
            headers={"Authorization": f"Bearer {tokens['agent']}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        for _ in range(COUNT):  # each failed validation is one notification
            body = {"node": "n1", "verdict": "fail", "summary": "hbm bandwidth low"}
            r = ctl.call("POST", "/api/v1/validation-results", json=body, timeout_s=30)
            assert r.status_code == 200, r.text

        def all_tried() -> set[str] | None:
            seen = set(rx.snapshot()[0])
            return seen if len(seen) == COUNT else None

        ids = wait_truthy(all_tried, 30, f"{COUNT} notifications tried while the receiver is down")
        st = _status(ctl)
        assert st["pending"] == COUNT and st["delivered"] == 0 and st["dead"] == 0, st
        assert st["failed_attempts"] >= COUNT and st["last_error"] == "HTTP 500", st
        rx.mode = "hold"  # the next attempt reaches the receiver; its answer never gets back
        held = wait_truthy(lambda: rx.held, 30, "an attempt held by the receiver")
        ctl.kill9()
        rx.release.set()
        rx.mode = "up"
        ctl.start()
        assert wait_until(lambda: set(rx.snapshot()[1]) == ids, 60), rx.snapshot()[1]
        assert wait_until(lambda: _status(ctl)["delivered"] == COUNT, 30), _status(ctl)
        st = _status(ctl)
        assert (st["pending"], st["in_flight"], st["dead"]) == (0, 0, 0), st
        admin_file = tmp_path / "admin.token"
        admin_file.write_text(tokens["admin"] + "\n", encoding="utf-8")
        admin_file.chmod(0o600)
        (shown,) = cli(
            ["notify", "status", "--controller", ctl.url, "--token-file", str(admin_file)],
            tmp_path,
        )["receivers"]
        assert shown["delivered"] == COUNT and shown["receiver"].startswith("webhook http://")
    finally:
        ctl.stop()
        rx.close()
    _, accepted = rx.snapshot()
    repeats = {i: n for i, n in Counter(accepted).items() if n > 1}
    # at least once: the one in flight at the kill came again, under its id; nothing else did
    assert repeats == {held: 2}, repeats
    assert len(accepted) == COUNT + 1
    logs = "".join(p.read_text() for p in data.glob("controller-*.log"))
    assert "s3cr3t-path" not in logs  # a webhook is named by scheme and host only
