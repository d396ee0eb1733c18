"""``POST /ingest``: documented here; answered by `gpufleet.control.api.ingest_http` (the
`IngestFastPath` middleware answers before routing, through the same `handle_ingest`)."""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from gpufleet.control.api.ingest_http import IngestReply
from gpufleet.control.service import ControlService
from gpufleet.wire import Batch
from gpufleet.wire import views as sc

Handler = Callable[[ControlService, str | None, str | None, bytes], Awaitable[IngestReply]]


def router(service: ControlService, handle: Handler) -> APIRouter:
    """``handle``: `gpufleet.control.api.ingest_http.handle_ingest` (the same as the fast path)."""
    api = APIRouter()

    @api.post(
        "/ingest",
        tags=["ingest"],
        response_model=sc.IngestAck,
        responses={
            413: {"model": sc.Problem, "description": "batch too large"},
            415: {"model": sc.Problem, "description": "unsupported Content-Encoding"},
            429: {"model": sc.Problem, "description": "back-pressure; see Retry-After"},
            400: {"model": sc.Problem, "description": "undecodable body"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": Batch.model_json_schema(
                            ref_template="#/components/schemas/{model}"
                        )
                    }
                },
            }
        },
    )
    async def ingest(request: Request) -> Any:
        """Agent batches (`gpufleet.wire.Batch`); acknowledged once durable."""
        reply = await handle(
            service,
            request.headers.get("authorization"),
            request.headers.get("content-encoding"),
            await request.body(),
        )
        return Response(
            reply.body, reply.status, dict(reply.headers), media_type="application/json"
        )

    return api
