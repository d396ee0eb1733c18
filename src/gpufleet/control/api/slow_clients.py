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
- **TLS**: uvicorn's own TLS (``create_server(ssl=...)``) tells the HTTP protocol of a
  connection only once its handshake is done, and asyncio gives a handshake 60 s: a client that
  opens and sends nothing, or half a ClientHello, was held a minute and counted nowhere. With a
  context (`guarded_protocol` ``tls=``) the server listens plain and `_TlsFront` upgrades each
  connection itself (``loop.start_tls``, asyncio's and uvloop's public call) the moment it is
  accepted: the connection counts toward the cap from then (refused past it: closed, since no
  HTTP answer can be read before a handshake), the handshake must end within
  ``header_timeout_s``, and the request head's deadline runs on from the accept, not from the
  handshake's end.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
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
                "%d open (--max-connections), %d closed for a TLS handshake or request head "
                "slower than %g s (--header-timeout)",
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
    accepted_at: float | None = None  # loop time of a TLS connection's accept (`_TlsFront`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.counts.bump(refused=True)
            # uvloop's transports are not asyncio.Transport instances, but write like one
            cast(asyncio.Transport, transport).write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        spent = 0.0 if self.accepted_at is None else self.loop.time() - self.accepted_at
        self._arm(max(0.0, self.header_timeout_s - spent))  # the deadline counts from the accept

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

    def _arm(self, delay_s: float | None = None) -> None:
        self._disarm()
        self._head_bytes = 0
        delay = self.header_timeout_s if delay_s is None else delay_s
        self._head_timer = self.loop.call_later(delay, self._head_late)

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


class _Handover(asyncio.Protocol):
    """What the TLS layer talks to between the handshake's end and `_TlsFront` handing the
    connection to the HTTP protocol: bytes that came first (a request right behind the
    client's Finished) wait here, so the HTTP protocol sees its ``connection_made`` first."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)

    def hand(self, tls: asyncio.Transport, http: asyncio.Protocol) -> None:
        """``http`` takes over ``tls``: connected, then told what came meanwhile."""
        http.connection_made(tls)
        tls.set_protocol(http)
        for data in self.data:
            http.data_received(data)
        if self.eof and self.lost is None and not http.eof_received():
            tls.close()
        if self.lost is not None:
            http.connection_lost(self.lost[0])


class _TlsFront(asyncio.Protocol):
    """A TLS connection from its accept: counted toward the cap, its handshake (``start_tls``)
    held to the head deadline, then handed to the guarded HTTP protocol.

    Bytes can come before ``start_tls`` holds the transport: uvloop starts reading right after
    ``connection_made`` whatever it paused (asyncio honours the pause), so a ClientHello may
    reach this protocol first. They are kept and fed to the TLS protocol (`_feed`) in the
    same pass of the loop in which ``start_tls`` took the transport over (and paused it), so
    nothing is lost or reordered."""

    http_class: type[_Guard]
    context: ssl.SSLContext
    handshakes: set[_TlsFront]  # accepted, handshake not done (one set per built class)

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # uvicorn makes one protocol object per accepted connection with these arguments
        self.http = self.http_class(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state=app_state, _loop=_loop
        )
        self.connections: set[Any] = server_state.connections
        self.loop = _loop or asyncio.get_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._raw: asyncio.Transport | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        http = self.http
        if len(self.connections) + len(self.handshakes) >= http.max_connections:
            http.counts.bump(refused=True)
            transport.close()  # no HTTP answer can be read before a handshake
            return
        raw = self._raw = cast(asyncio.Transport, transport)
        raw.pause_reading()
        self.handshakes.add(self)
        self._task = self.loop.create_task(self._handshake(raw))
        # runs right after the task's first step, in which start_tls swaps the protocol
        self.loop.call_soon(self._feed)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)  # before start_tls took the transport (uvloop)
        if self._raw is not None:
            self._raw.pause_reading()

    def _feed(self) -> None:
        """Give the TLS protocol the bytes that came to this one (into its incoming buffer:
        its handshake reads them first)."""
        early, self._early = self._early, []
        raw = self._raw
        if not early or raw is None or raw.is_closing():
            return
        tls = raw.get_protocol()
        if tls is self:  # pragma: no cover - start_tls did not take the transport over
            raw.abort()
            return
        for chunk in early:
            if not isinstance(tls, asyncio.BufferedProtocol) and not hasattr(tls, "get_buffer"):
                cast(asyncio.Protocol, tls).data_received(chunk)
                continue
            buffered = cast(asyncio.BufferedProtocol, tls)
            view = memoryview(chunk)
            while view:
                buf = memoryview(buffered.get_buffer(len(view)))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                buffered.buffer_updated(n)
                view = view[n:]

    async def _handshake(self, raw: asyncio.Transport) -> None:
        http, started = self.http, self.loop.time()
        handover = _Handover()
        try:
            tls = await self.loop.start_tls(
                raw,
                handover,
                self.context,
                server_side=True,
                ssl_handshake_timeout=http.header_timeout_s,
            )
        except Exception:  # timed out, reset, not TLS: the TLS layer closed it (debug log)
            if self.loop.time() - started >= http.header_timeout_s:
                http.counts.bump(refused=False)
            raw.abort()
            return
        finally:
            self.handshakes.discard(self)
        if tls is None or tls.is_closing():  # closed as the handshake ended (uvloop: an EOF)
            raw.abort()
            return
        http.accepted_at = started
        handover.hand(tls, http)

    def connection_lost(self, exc: Exception | None) -> None:
        self.handshakes.discard(self)  # closed before start_tls took it over


def guarded_protocol(
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    tls: ssl.SSLContext | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed, as its ``auto``; else h11) with
    the head deadline and the connection cap; pass it as ``uvicorn.Config(http=...)``. With
    ``tls`` (a server context), connections are TLS, upgraded by `_TlsFront` (give uvicorn no
    ``ssl_*`` options then)."""
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
    guarded = type(f"Guarded{base.__name__}", (_Guard, base), attrs)
    if tls is None:
        return guarded
    front = {
        "http_class": guarded,
        "context": tls,
        "handshakes": set(),
        "__doc__": f"TLS in front of {guarded.__name__}, from the accept.",
    }
    return type(f"Tls{guarded.__name__}", (_TlsFront,), front)
