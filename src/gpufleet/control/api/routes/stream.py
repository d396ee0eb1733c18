"""``/stream``: server-sent events of the fleet summary and new events. The summary comes from
the writer's snapshot; the event query runs on a worker thread, off the event loop."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.fleet import queries as qy
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal
from gpufleet.wire import views as sc


def router(service: ControlService, auth: Auth) -> APIRouter:
    store = service.store
    api = APIRouter()

    def new_events(who: Principal, since_id: int | None, limit: int) -> list[sc.EventOut]:
        return qy.events(
            store, who, node=None, kind=None, since_id=since_id, before_id=None, limit=limit
        )

    @api.get("/stream", include_in_schema=False)
    async def stream(
        request: Request,
        who: Annotated[Principal, auth.viewer],
        max_s: Annotated[float, Query(ge=1, le=86400)] = 3600.0,
    ) -> StreamingResponse:
        """Server-sent events: a ``summary`` whenever the fleet changed (checked each second),
        and the new ``events`` since the last message. EventSource cannot send headers; read it
        with fetch() and a ReadableStream (Authorization header)."""

        async def gen() -> AsyncIterator[bytes]:
            last_gen = -1
            newest = await asyncio.to_thread(new_events, who, None, 1)
            last_event = max((e.id for e in newest), default=0)
            start = time.monotonic()
            yield b"retry: 2000\n\n"
            while time.monotonic() - start < max_s:
                if service.closing.is_set() or await request.is_disconnected():
                    return  # the controller stops: the client reconnects to whoever serves
                view = store.view
                if view.generation != last_gen:
                    last_gen = view.generation
                    summ = qy.summary(store, who, service.ingest.pending).model_dump(mode="json")
                    yield f"event: summary\ndata: {json.dumps(summ)}\n\n".encode()
                    new = await asyncio.to_thread(new_events, who, last_event, 200)
                    if new:
                        last_event = max(e.id for e in new)
                        data = json.dumps([e.model_dump(mode="json") for e in reversed(new)])
                        yield f"event: events\ndata: {data}\n\n".encode()
                else:
                    yield b": keep-alive\n\n"
                await asyncio.sleep(1.0)

        return StreamingResponse(
            gen(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    return api
