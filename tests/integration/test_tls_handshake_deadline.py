"""TLS connections that never finish their handshake, against a real controller serving HTTPS
(issue 29): they are closed at the head deadline (`--header-timeout`), not after asyncio's 60 s
handshake timeout, and they count toward `--max-connections` from their accept, while a normal
HTTPS client is answered meanwhile.

Before the fix uvicorn's own TLS (``create_server(ssl=...)``) held each such connection 60 s
and counted none of them (its HTTP protocol hears of a connection only after the handshake):
the refusal at the cap and the wait for the closes fail on the old code."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.timescale import scaled
from tests.integration.test_tls import make_cert
from tests.waiting import wait_until

pytestmark = pytest.mark.process

HEAD_DEADLINE_S = 3.0  # the controller's --header-timeout (scaled): the steps below take < 1 s
SLACK_S = 6.0  # closed by then at the latest (scaled by the wait)
CAP = 30  # its --max-connections


def client_hello_start() -> bytes:
    """The first half of a real TLS ClientHello (a client that stalls mid-handshake)."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    return hello[: len(hello) // 2]


class Silent:
    """Raw TCP connections that never complete a TLS handshake: every other one sends half a
    ClientHello, the rest nothing; which of them the server has closed."""

    def __init__(self, port: int, n: int) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
        half = client_hello_start()
        for i, s in enumerate(self.socks):
            if i % 2:
                s.sendall(half)
            s.setblocking(False)
        self.closed: set[int] = set()

    def open(self) -> int:
        for i, s in enumerate(self.socks):
            if i in self.closed:
                continue
            try:
                while s.recv(4096):  # an alert, if any, then the close
                    pass
                self.closed.add(i)  # end of stream
            except BlockingIOError:
                pass
            except OSError:  # reset
                self.closed.add(i)
        return len(self.socks) - len(self.closed)

    def close(self) -> None:
        for s in self.socks:
            s.close()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    cert, key = make_cert(tmp_path, "ctl", "IP:127.0.0.1,DNS:localhost")
    data = tmp_path / "d"
    admin = create_tokens(data, {"admin": ("admin", None)})["admin"]
    limits = ["--header-timeout", f"{scaled(HEAD_DEADLINE_S):g}", "--max-connections", str(CAP)]
    ctl = ControllerProcess(data, admin, scheduler="none", args=limits, tls=(cert, key)).start()
    try:
        yield ctl
    finally:
        ctl.stop()


def test_handshakes_that_never_end_are_closed_and_counted(controller: ControllerProcess) -> None:
    def health() -> int:
        r = httpx.get(controller.url + "/api/v1/health", verify=controller.verify(), timeout=10)
        return r.status_code

    opened: list[Silent] = []
    try:
        below = Silent(controller.port, CAP - 2)  # room for a readiness probe still closing
        opened.append(below)
        assert below.open() == CAP - 2
        assert health() == 200  # a normal HTTPS client is answered meanwhile
        extra = Silent(controller.port, 4)  # the cap is reached (and passed: refused, closed)
        opened.append(extra)
        with pytest.raises(httpx.ConnectError):  # counted from the accept: no slot is left
            health()
        assert below.open() == CAP - 2  # still within the deadline: the refusal was the cap
        closed = wait_until(lambda: below.open() + extra.open() == 0, HEAD_DEADLINE_S + SLACK_S)
        assert closed, f"{below.open()} + {extra.open()} handshakes still open"
    finally:
        for silent in opened:
            silent.close()
    assert health() == 200
    assert controller.proc is not None
    controller.stop()
    log = "".join(p.read_text(errors="replace") for p in controller.data_dir.glob("*.log"))
    assert "Traceback" not in log, log[-3000:]
