"""Slow and too many clients: a deadline on every request head and a cap on open connections,
around uvicorn's HTTP protocol (issue 29, slowloris).

uvicorn alone holds a connection as long as its client sends a byte now and then: its
keep-alive timer is only armed after a response and is cancelled by every byte received, and a
new connection has no timer at all. Its ``limit_concurrency`` does not help: it is looked at
only once a request head is complete (then answered 503), so connections that never finish
their head are neither counted out nor closed. Here:

- **head deadline**: from the moment a connection opens, and again after each response on a
  kept-alive connection, the next request head must be complete within ``header_timeout_s``;
  past it the connection is closed (with ``408 Request Timeout`` when part of a head came, as
  nginx's ``client_header_timeout``). A request in flight (its body, a long response, a
  stream) is not timed here.
- **connection cap**: a connection opened while ``max_connections`` are open is answered
  ``503`` with ``Retry-After`` and closed at once, so open sockets (and file descriptors) stay
  bounded whatever clients do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, cast

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 2048
WARN_EVERY_S = 60.0  # one log line a minute at most for refusals and timeouts

log = logging.getLogger("gpufleet.control.api")

_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 25\r\nconnection: close\r\n\r\nrequest header too slow\r\n"
)
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\ncontent-length: 22\r\nconnection: close\r\n\r\ntoo many connections\r\n"
)


class _Counts:
    """How many connections were refused or timed out, logged at most every `WARN_EVERY_S`."""

    def __init__(self, header_timeout_s: float, max_connections: int) -> None:
        self.limits = (header_timeout_s, max_connections)
        self.refused = 0
        self.timed_out = 0
        self._logged_s = -WARN_EVERY_S

    def bump(self, refused: bool) -> None:
        if refused:
            self.refused += 1
        else:
            self.timed_out += 1
        now = time.monotonic()
        if now - self._logged_s >= WARN_EVERY_S:
            self._logged_s = now
            log.warning(
                "slow or too many clients (counts since start): %d connection(s) refused with "
                "%d open (--max-connections), %d closed for a request head slower than %g s "
                "(--header-timeout)",
                self.refused,
                self.limits[1],
                self.timed_out,
                self.limits[0],
            )


class _Guard(asyncio.Protocol):
    """The deadline and the cap, mixed in before one of uvicorn's HTTP protocol classes."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    counts: _Counts
    if TYPE_CHECKING:  # uvicorn's protocol's own attributes
        connections: set[Any]
        cycle: Any
        loop: asyncio.AbstractEventLoop
        transport: asyncio.Transport

    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    _refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.counts.bump(refused=True)
            # uvloop's transports are not asyncio.Transport instances, but write like one
            cast(asyncio.Transport, transport).write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        before = self.cycle
        self._head_bytes += len(data)
        super().data_received(data)
        if self.cycle is not before:  # a request head is complete: its request has begun
            self._disarm()

    def on_response_complete(self) -> None:
        before = self.cycle
        super().on_response_complete()  # type: ignore[misc]
        if self.cycle is before and not self.transport.is_closing():
            self._arm()  # kept alive: the next head has its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._refused:
            super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport.is_closing() or transport.get_protocol() is not self:
            return  # closed already, or upgraded to another protocol (a WebSocket)
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is in flight; its response re-arms the deadline
        if self._head_bytes:
            self.counts.bump(refused=False)
            transport.write(_TIMEOUT)
        transport.close()


def guarded_protocol(
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed, as its ``auto``; else h11) with
    the head deadline and the connection cap; pass it as ``uvicorn.Config(http=...)``."""
    base: type[asyncio.Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    attrs = {
        "header_timeout_s": float(header_timeout_s),
        "max_connections": int(max_connections),
        "counts": _Counts(float(header_timeout_s), int(max_connections)),
        "__doc__": f"{base.__name__} with a head deadline and a connection cap.",
    }
    return type(f"Guarded{base.__name__}", (_Guard, base), attrs)
