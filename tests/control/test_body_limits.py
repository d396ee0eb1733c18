"""Bodies against a real controller process (``python -m gpufleet controller``, uvicorn): a
write without a valid token is answered 401 from its headers, a body past its route's cap 413,
before the body is read, so four concurrent unauthenticated 250 MB bodies leave the process's
peak memory (``VmHWM``) within 50 MB of idle."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpufleet.control.api.bodylimits import DEFAULT_BODY_CAP
from gpufleet.control.api.ingest_http import MAX_WIRE_BYTES
from gpufleet.control.db.engine import database_url, make_engine, migrate
from gpufleet.control.state.store import ControlStore
from tests.control.conftest import free_port, wait_for

pytestmark = pytest.mark.slow

BIG = 250_000_000
CHUNK = b"x" * 2**20
# every write route of the API (path parameters filled in); each must refuse before the body
WRITES = [
    ("POST", "/api/v1/ingest"),
    ("POST", "/api/v1/nodes/n1/actions/cordon"),
    ("PATCH", "/api/v1/nodes/n1"),
    ("POST", "/api/v1/validation-results"),
    ("PUT", "/api/v1/policy"),
    ("POST", "/api/v1/tokens"),
    ("DELETE", "/api/v1/tokens/1"),
    ("POST", "/api/v1/findings/1/acknowledge"),
    ("POST", "/api/v1/jobs"),
    ("POST", "/api/v1/jobs/1/cancel"),
]


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    port: int
    admin: str

    def vm_hwm_kib(self) -> int:
        """Peak resident memory of the controller process (``VmHWM``), in KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    data = tmp_path_factory.mktemp("body") / "data"
    engine = make_engine(database_url(data, None))
    migrate(engine)
    admin = ControlStore(engine, clock=time.time).tokens.create("admin")[0]
    engine.dispose()
    port = free_port()
    log = (data.parent / "controller.log").open("ab")
    cmd = [sys.executable, "-m", "gpufleet", "controller", "--data-dir", str(data)]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=log)

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).is_success
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(healthy, timeout=60), (data.parent / "controller.log").read_text()
        yield Controller(proc, port, admin)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@dataclass
class Answer:
    status: int
    sent: int  # body bytes the client had sent when the answer came
    seconds: float


def send_body(
    port: int,
    method: str,
    path: str,
    size: int,
    token: str | None = None,
    *,
    chunked: bool = False,
    limit_s: float = 30.0,
) -> Answer:
    """Send headers announcing ``size`` body bytes (or a chunked body), then the body in 1 MiB
    pieces until the server answers; the status, and how much of the body it took."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    if token:
        head.append(f"Authorization: Bearer {token}")
    t0 = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        while time.monotonic() - t0 < limit_s:
            readable, writable, _ = select.select([sock], [sock] if sent < size else [], [], 1.0)
            if readable:
                reply = sock.recv(65536)
                assert reply.startswith(b"HTTP/1.1 "), reply[:200]
                return Answer(int(reply.split()[1]), sent, time.monotonic() - t0)
            if writable:
                piece = CHUNK[: size - sent]
                frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                try:
                    sock.sendall(frame)
                except (BrokenPipeError, ConnectionResetError):
                    continue  # the server answered and closed; read the answer
                sent += len(piece)
    raise AssertionError(f"{method} {path}: no answer within {limit_s} s ({sent} bytes sent)")


@pytest.mark.process
def test_unauthenticated_writes_are_refused_before_their_body(controller: Controller) -> None:
    for method, path in WRITES:
        for token in (None, "gf_not-a-token"):
            got = send_body(controller.port, method, path, BIG, token)
            assert got.status == 401, (method, path, got)
            assert got.sent < 64 * 2**20, (method, path, got)  # not the 250 MB


@pytest.mark.process
def test_bodies_past_their_cap_are_413_before_they_are_read(controller: Controller) -> None:
    port, admin = controller.port, controller.admin
    for method, path in WRITES:
        cap = MAX_WIRE_BYTES if path.endswith("/ingest") else DEFAULT_BODY_CAP
        if path.endswith("/validation-results"):
            cap = 4 * 2**20
        declared = send_body(port, method, path, BIG, admin)
        assert declared.status == 413 and declared.sent < 64 * 2**20, (method, path, declared)
        streamed = send_body(port, method, path, BIG, admin, chunked=True)
        assert streamed.status == 413, (method, path, streamed)
        # refused once past the cap: at the cap itself when the chunk framing already tipped it
        assert cap <= streamed.sent < cap + 64 * 2**20, (method, path, streamed)


@pytest.mark.process
def test_four_unauthenticated_250mb_bodies_leave_peak_memory_near_idle(
    controller: Controller,
) -> None:
    port = controller.port
    for _ in range(3):  # warm up: lazy imports, first requests of each kind
        send_body(port, "POST", "/api/v1/ingest", 1000)
        send_body(port, "PUT", "/api/v1/policy", 1000)
    idle = controller.vm_hwm_kib()
    answers: list[Answer] = []
    routes = ["/api/v1/ingest", "/api/v1/jobs", "/api/v1/validation-results", "/api/v1/ingest"]

    def one(path: str) -> None:
        answers.append(send_body(port, "POST", path, BIG))

    threads = [threading.Thread(target=one, args=(p,)) for p in routes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    peak = controller.vm_hwm_kib()
    print(f"VmHWM idle {idle / 1024:.1f} MiB, after 4 x 250 MB unauthenticated {peak / 1024:.1f}")
    assert [a.status for a in answers] == [401] * 4, answers
    # the "401 fast": answered before the body, not after reading 250 MB of it
    assert all(a.sent < 64 * 2**20 for a in answers), answers
    assert (peak - idle) * 1024 < 50e6, (idle, peak)  # within 50 MB (VmHWM is in KiB)
