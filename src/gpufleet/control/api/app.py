"""The REST API (`/api/v1`, OpenAPI at `/api/v1/openapi.json`) and the dashboard's static files
at `/`. `create_app(service)` builds a FastAPI app over one `ControlService` from the routers in
`gpufleet.control.api.routes` (one per area) and `gpufleet.control.api.routes.jobs`.

Roles per endpoint: reads need ``viewer``; lifecycle actions, acknowledgements, node attributes,
validation results and the audit log need ``operator``; tokens and policy need ``admin``; ingest
takes ``agent`` tokens (bound to the batch's node) and ``admin``. Refused writes are audited.
A token with a tenant is confined to it (`gpufleet.control.state.auth`; the full matrix is
docs/tenants.md).
Reads come from the writer's snapshot or the database; writes are commands to the writer.
"""

import math
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from gpufleet import __version__
from gpufleet.control.api.bodylimits import WriteGuard
from gpufleet.control.api.db_errors import DATABASE_AWAY, DETAIL, RETRY_AFTER_S
from gpufleet.control.api.ingest_http import IngestFastPath, IngestReply, handle_ingest
from gpufleet.control.api.routes import (
    energy,
    findings,
    ingest,
    maintenance,
    meta,
    nodes,
    notifications,
    policy,
    power,
    prometheus,
    stream,
    tokens,
)
from gpufleet.control.api.routes import jobs as api_jobs
from gpufleet.control.api.routes.deps import ERRORS, Auth
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import install_log_redaction
from gpufleet.control.state.deafness import PulseMiddleware
from gpufleet.control.state.lifecycle import TransitionError
from gpufleet.control.state.store import NotFound, StaleCache
from gpufleet.errors import UsageError

ERROR_STATUS: dict[type[Exception], int] = {
    NotFound: 404,
    TransitionError: 409,  # before UsageError, its base class
    # another replica moved the node since this one's cache read it: nothing was written and
    # the cache is reloaded, so the caller's retry acts on fresh state (was a 500, traceback)
    StaleCache: 409,
    UsageError: 422,
    PermissionError: 403,
}


DOCS_PATH = "/api/v1/docs"


def mount_api_docs(app: FastAPI) -> None:
    """Swagger UI at ``/api/v1/docs``, its scripts and styles served from the installed
    ``swagger-ui-bundle`` package: the page loads nothing from the network (FastAPI's default
    page pulls them from a CDN, which an air-gapped cluster cannot reach and which would see
    every operator who opens the page)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from swagger_ui_bundle import swagger_ui_path

    assets = f"{DOCS_PATH}/assets"
    app.mount(assets, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "",
            title=f"{app.title} - API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
        )


def create_app(service: ControlService) -> FastAPI:
    """The FastAPI application of one controller."""
    install_log_redaction()
    store = service.store
    app = FastAPI(
        title="gpufleet control plane",
        version=__version__,
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # served below from the package's own copy of Swagger UI
        redoc_url=None,
        description="Fleet state, telemetry, findings, lifecycle actions and ingest.",
    )
    app.state.service = service
    for exc_type, status in ERROR_STATUS.items():
        app.add_exception_handler(exc_type, _answer(status))
    app.add_exception_handler(RequestValidationError, _invalid_request)
    for exc_type in DATABASE_AWAY:
        app.add_exception_handler(exc_type, _database_away)

    auth = Auth(store)
    api = APIRouter(prefix="/api/v1", responses=ERRORS)
    api.include_router(meta.router(auth, service))
    api.include_router(nodes.router(service, auth))
    api.include_router(findings.router(store, auth))
    api.include_router(policy.router(store, auth))
    api.include_router(tokens.router(store, auth))
    api.include_router(prometheus.router(store, auth))
    api.include_router(ingest.router(service, _handle_ingest))
    api.include_router(stream.router(service, auth))
    api.include_router(maintenance.router(store, auth))
    api.include_router(power.router(store, auth, service.scheduler))
    api.include_router(energy.router(service, auth))
    api.include_router(notifications.router(store, auth))
    api_jobs.register(api, service, auth.need)
    app.include_router(api)
    app.add_middleware(WriteGuard, store=store)  # token and size before a write's body
    app.add_middleware(IngestFastPath, service=service)  # ingest skips routing (ingest_http)
    # the loop's own late wakes: deaf time, not the agents' silence (control/state/deafness.py)
    app.add_middleware(PulseMiddleware, deaf=store.deaf, clock=store.clock)
    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document, with the wire schema's definitions moved into components."""
        doc = base_openapi()
        body = doc["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]
        defs = body["application/json"]["schema"].pop("$defs", None)
        if defs:
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    mount_api_docs(app)
    from gpufleet.web import static_dir

    app.mount("/", StaticFiles(directory=str(static_dir()), html=True), name="web")
    return app


async def _handle_ingest(
    service: ControlService, authorization: str | None, encoding: str | None, body: bytes
) -> IngestReply:
    # ``handle_ingest`` looked up in this module at call time, so the route and the fast path
    # are provably the same function (tests replace it here to count routed requests)
    return await handle_ingest(service, authorization, encoding, body)


def _answer(status: int) -> Any:
    """An exception handler answering ``status`` with the exception's text as ``detail``."""

    async def handler(_r: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite number (NaN, infinities: a body's ``1e309``) as its
    text, so the answer is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


async def _database_away(_r: Request, exc: Exception) -> JSONResponse:
    """503 with ``Retry-After`` while the database is away (`db_errors`)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse({"detail": DETAIL}, status_code=503, headers=headers)


async def _invalid_request(_r: Request, exc: Exception) -> JSONResponse:
    """422 for a request that fails validation, in FastAPI's shape (``detail``: one entry
    per problem, with ``loc`` naming the field), JSON-safe whatever the body held."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": _json_safe(jsonable_encoder(errors))}, status_code=422)
