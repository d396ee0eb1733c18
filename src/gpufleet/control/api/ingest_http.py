"""The HTTP side of ``POST /api/v1/ingest``: one framework-free handler (token, size and
encoding checks, parsing, group commit, the `Ack`), served by a small ASGI layer in front of
FastAPI's router.

Routing, dependency resolution and response models cost a few hundred microseconds a request
in FastAPI, as much as the rest of the ingest path together; agents push many small batches, so
`IngestFastPath` answers this one route itself. The FastAPI route stays registered (OpenAPI
documents it; it calls the same `handle_ingest`), so the two can never answer differently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.control.api.bodylimits import (
    INGEST_WIRE_BYTES,
    bearer_principal,
    declared_length,
    header,
    read_capped,
)
from gpufleet.control.api.db_errors import DATABASE_AWAY, DETAIL, RETRY_AFTER_S
from gpufleet.control.campaigns import ops as campaign_ops
from gpufleet.control.ingest.queue import (
    IngestRejected,
    Parsed,
    decode_body,
    parse_batch,
    queue_item,
)
from gpufleet.control.jobs.slots import trusted_jobs_report
from gpufleet.control.power import ops as power_ops
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.store import IngestItem

if TYPE_CHECKING:
    from gpufleet.control.service import ControlService

INGEST_PATH = "/api/v1/ingest"
MAX_WIRE_BYTES = INGEST_WIRE_BYTES  # a request body past this is refused before it is all read

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class IngestReply:
    """Status, JSON body and extra headers of one ingest answer."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


CLOSE = (("Connection", "close"),)  # answered before the body was read: the client may still send


def _problem(
    status: int,
    detail: str,
    headers: tuple[tuple[str, str], ...] = (),
    extra: dict[str, Any] | None = None,
) -> IngestReply:
    return IngestReply(status, orjson.dumps({"detail": detail, **(extra or {})}), headers)


async def handle_ingest(
    service: ControlService,
    authorization: str | None,
    content_encoding: str | None,
    body: bytes,
) -> IngestReply:
    """Everything the ingest endpoint does, from headers and body to the answer; the
    database away is a 503 with ``Retry-After`` (the batch was not acknowledged, so the agent
    keeps it and pushes it again)."""
    try:
        who = _authorized(await bearer_principal(service.store, authorization))
        if isinstance(who, IngestReply):
            return who
        return await ingest_body(service, who, content_encoding, body)
    except DATABASE_AWAY:
        return database_away()


def database_away() -> IngestReply:
    """503 with ``Retry-After``: the database is away, the batch is not acknowledged."""
    return _problem(503, DETAIL, (("Retry-After", str(RETRY_AFTER_S)),))


def _authorized(who: Principal | None) -> Principal | IngestReply:
    """``who`` when it may push, else its 401/403 answer."""
    if who is None:
        return _problem(401, "missing, unknown or revoked token", CLOSE)
    if not (who.role is Role.AGENT or who.role is Role.ADMIN):
        return _problem(403, f"ingest needs an agent token; this one is {who.role}", CLOSE)
    return who


async def ingest_body(
    service: ControlService, who: Principal, content_encoding: str | None, body: bytes
) -> IngestReply:
    """The ingest answer for a body pushed with ``who``'s token (checked already)."""
    store = service.store
    admitted = await _admit(service, who, content_encoding, body)
    if isinstance(admitted, IngestReply):
        return admitted
    item, dropped = admitted
    t0 = time.perf_counter()
    ack = await service.ingest.submit(item)
    service.ingest.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
    out: dict[str, Any] = {"agent_id": ack.agent_id, "seq": ack.seq, "duplicate": ack.duplicate}
    # the scheduler sees the batch's job report later, on its own thread; the commands it has
    # for this node (from earlier reports) ride on this Ack
    batch = item.batch
    view = store.view.nodes.get(batch.node)
    batch = trusted_jobs_report(batch, who, view)
    cmds = store.sched.exchange(batch, store.clock())
    if cmds:  # an Ack without commands is exactly what it was before jobs existed
        out["commands"] = [c.model_dump(mode="json") for c in cmds]
    if ack.acks:  # findings acknowledged on the control plane that the agent still reports
        out["acks"] = [a.model_dump(mode="json") for a in ack.acks]
    if dropped:  # samples and events refused one by one, counted by field
        out["dropped"] = dropped
    if view is not None and view.state == "validating":  # the agent validates (issue 14)
        out["validate_since_s"] = view.state_since_s
        level = campaign_ops.validation_level(store, batch.node)
        if level is not None:  # a campaign asks more than the gate's level 1
            out["validate_level"] = level
    order = campaign_ops.orders(store).get(batch.node)  # a campaign's update (issue 15)
    if order is not None:
        out["update"] = order.model_dump(mode="json")
    power = power_ops.orders(store).get(batch.node)  # power orders (issue 16)
    if power:
        out["power"] = [o.model_dump(mode="json") for o in power]
    return IngestReply(200, orjson.dumps(out))


async def _admit(
    service: ControlService, who: Principal, content_encoding: str | None, body: bytes
) -> tuple[IngestItem, dict[str, int]] | IngestReply:
    """The batch as the writer takes it (its samples as arrays only: `queue_item`) and the
    counts of what screening left out, or the refusal."""
    store = service.store
    received = store.clock()
    try:
        service.ingest.check_capacity("")
        parsed = await _parse(body, content_encoding, received)
        batch = parsed.head  # the batch without its sample blocks (they are arrays now)
        nc = store.view.nodes.get(batch.node)
        if not who.may_push_for(batch.node, nc.tenant if nc else None, nc is not None):
            if who.node is not None and who.node != batch.node:
                return _problem(403, f"this agent token is bound to node {who.node!r}")
            return _problem(403, f"node {batch.node!r} is not of this token's tenant")
        if batch.jobs is not None and service.exchange_elsewhere():
            # the embedded scheduler's command channel is the leader's (issue 18): 503 makes
            # the agent move to the next replica at once (`gpufleet.replicas`)
            raise IngestRejected(503, "this replica does not lead: jobs reports go to the leader")
        refusal = await service.node_quota.check(who, batch.node)
        if refusal is not None:
            return _problem(403, refusal)
        service.ingest.check_capacity(batch.node)
        if parsed.unusable:  # every sample was out of range: nothing to store but the heartbeat
            store.writer.submit(lambda: store.touch(batch.node, received))
            raise IngestRejected(422, f"no usable sample in the batch: dropped {parsed.dropped}")
    except IngestRejected as exc:
        retry = (("Retry-After", str(exc.retry_after_s)),) if exc.retry_after_s else ()
        return _problem(exc.status, exc.reason, retry, exc.extra)
    return queue_item(parsed, who, received), parsed.dropped


OFF_LOOP_BYTES = 32 * 1024  # bodies past this (gzip: a quarter of it) are parsed off the loop


async def _parse(body: bytes, content_encoding: str | None, now_s: float) -> Parsed:
    """Decode and validate a body; a large one on a worker thread, so a big batch (up to
    MAX_BATCH_BYTES of JSON) never holds the event loop while other requests wait."""
    gzip = (content_encoding or "").strip().lower() == "gzip"
    if len(body) * (4 if gzip else 1) <= OFF_LOOP_BYTES:
        return parse_batch(decode_body(body, content_encoding), now_s)
    return await asyncio.to_thread(lambda: parse_batch(decode_body(body, content_encoding), now_s))


class IngestFastPath:
    """ASGI middleware: ``POST /api/v1/ingest`` straight to `handle_ingest`; the rest to the
    wrapped application."""

    def __init__(self, app: ASGIApp, service: ControlService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != INGEST_PATH
            or scope["method"] != "POST"
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        try:
            reply = await self._reply(scope, receive)
        except DATABASE_AWAY:  # as in handle_ingest: not acknowledged, the agent retries
            reply = database_away()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(reply.body)).encode()),
        ]
        headers += [(k.lower().encode(), v.encode()) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})

    async def _reply(self, scope: Scope, receive: Receive) -> IngestReply:
        # token and declared size first: a refused client's body is never read
        who = _authorized(
            await bearer_principal(self.service.store, header(scope, b"authorization"))
        )
        if isinstance(who, IngestReply):
            return who
        length = declared_length(scope)
        if length == -1:
            return _problem(400, "Content-Length is not a number", CLOSE)
        if length is not None and length > MAX_WIRE_BYTES:
            return _problem(413, f"body is {length} bytes; the limit is {MAX_WIRE_BYTES}", CLOSE)
        body, too_big = await read_capped(receive, MAX_WIRE_BYTES)
        if too_big:
            return _problem(413, f"request body is over {MAX_WIRE_BYTES} bytes", CLOSE)
        return await ingest_body(self.service, who, header(scope, b"content-encoding"), body)
