"""Bearer token and body size checked before a request body is read, for every ``/api/v1``
write (``POST``, ``PUT``, ``PATCH``, ``DELETE``) that FastAPI answers.

A request without a known token is answered 401 from its headers alone, and a body past its
route's cap 413 (from ``Content-Length`` when the client sends one, after reading just past the
cap when it streams): an unauthenticated client cannot make the controller hold its body in
memory, however large. The routes still check roles (403) themselves; a body within its cap is
handed to them unchanged. Ingest has its own fast path (`gpufleet.control.api.ingest_http`) with
the same order of checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.control.api.db_errors import DATABASE_AWAY, DETAIL, RETRY_AFTER_S
from gpufleet.wire import MAX_BATCH_BYTES

if TYPE_CHECKING:
    from gpufleet.control.state.auth import Principal
    from gpufleet.control.state.store import ControlStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PREFIX = "/api/v1/"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_BODY_CAP = 1 * 2**20  # policy, node attributes, job specs, token requests: a few KiB
INGEST_WIRE_BYTES = MAX_BATCH_BYTES + 2**16  # a batch gzips to less (+ headers if incompressible)
BODY_CAPS: dict[str, int] = {  # path prefix below /api/v1 -> cap in bytes
    "ingest": INGEST_WIRE_BYTES,  # `ingest_http` answers it first; this is for a root_path mount
    "validation-results": 4 * 2**20,  # a whole `gpufleet validate` report may ride along
}


def body_cap(path: str) -> int:
    """The most bytes a write to ``path`` (``/api/v1/...``) may carry."""
    rest = path[len(API_PREFIX) :]
    for prefix, cap in BODY_CAPS.items():
        if rest == prefix or rest.startswith(prefix + "/"):
            return cap
    return DEFAULT_BODY_CAP


def header(scope: Scope, name: bytes) -> str | None:
    """One request header (the first of its name), as text."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def declared_length(scope: Scope) -> int | None:
    """``Content-Length`` as a number; None when absent; -1 when it is not a number."""
    raw = header(scope, b"content-length")
    if raw is None:
        return None
    raw = raw.strip()
    return int(raw) if raw.isdigit() and len(raw) < 20 else -1


async def bearer_principal(store: ControlStore, authorization: str | None) -> Principal | None:
    """The principal of an ``Authorization: Bearer`` header, or None; the database is asked
    (off the event loop) only for a token not seen before."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    known, who = store.tokens.cached(token)
    if not known:
        who = await asyncio.to_thread(store.tokens.resolve, token)
    return who


async def answer(
    send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """A JSON problem answer (``{"detail": ...}``), closing the connection: the client may
    still be sending a body nobody will read."""
    body = orjson.dumps({"detail": detail})
    hdrs = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def read_capped(receive: Receive, cap: int) -> tuple[bytes, bool]:
    """The request body, or (b"", True) as soon as it passes ``cap`` bytes (the rest is never
    read). A client that disconnects midway leaves what arrived."""
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > cap:
            return b"", True
        parts.append(chunk)
        if not msg.get("more_body", False):
            break
    return b"".join(parts), False


class WriteGuard:
    """ASGI middleware: token (401) and size (413) checks of ``/api/v1`` writes before the
    body is read; within its cap the body is read here and replayed to the application."""

    def __init__(self, app: ASGIApp, store: ControlStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in WRITE_METHODS
            or not scope["path"].startswith(API_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        auth = header(scope, b"authorization")
        if auth is None or not auth.lower().startswith("bearer "):
            await answer(send, 401, "missing bearer token", ((b"www-authenticate", b"Bearer"),))
            return
        try:
            who = await bearer_principal(self.store, auth)
        except DATABASE_AWAY:  # a token not cached yet is looked up in the database
            await answer(send, 503, DETAIL, ((b"retry-after", str(RETRY_AFTER_S).encode()),))
            return
        if who is None:
            await answer(send, 401, "unknown or revoked token", ((b"www-authenticate", b"Bearer"),))
            return
        cap = body_cap(scope["path"])
        length = declared_length(scope)
        if length == -1:
            await answer(send, 400, "Content-Length is not a number")
            return
        if length is not None and length > cap:
            await answer(send, 413, f"request body is {length} bytes; the limit here is {cap}")
            return
        body, too_big = await read_capped(receive, cap)
        if too_big:
            await answer(send, 413, f"request body is over the {cap}-byte limit here")
            return
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` once, then whatever the client sends next (its
    disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
