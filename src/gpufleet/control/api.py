"""The REST API (`/api/v1`, OpenAPI at `/api/v1/openapi.json`) and the dashboard's static files
at `/`. `create_app(service)` builds a FastAPI app over one `ControlService`.

Roles per endpoint: reads need ``viewer``; lifecycle actions, acknowledgements, node attributes,
validation results and the audit log need ``operator``; tokens and policy need ``admin``; ingest
takes ``agent`` tokens (bound to the batch's node) and ``admin``. Refused writes are audited.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from gpufleet import __version__
from gpufleet.control import actions as act
from gpufleet.control import api_jobs
from gpufleet.control import queries as qy
from gpufleet.control import schemas as sc
from gpufleet.control.auth import Principal, Role, install_log_redaction
from gpufleet.control.ingest_http import IngestFastPath, handle_ingest
from gpufleet.control.lifecycle import Action, NodeState, TransitionError
from gpufleet.control.remediation import RemediationPolicy
from gpufleet.control.service import ControlService
from gpufleet.control.store import NodeCache, NotFound
from gpufleet.errors import UsageError
from gpufleet.wire import Batch

bearer = HTTPBearer(auto_error=False, description="gpufleet API token (gf_...)")
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": sc.Problem, "description": "missing or unknown token"},
    403: {"model": sc.Problem, "description": "the token's role may not do this"},
    404: {"model": sc.Problem, "description": "no such node, finding or token"},
    409: {"model": sc.Problem, "description": "lifecycle transition not allowed"},
    422: {"model": sc.Problem, "description": "malformed request"},
}
NodeName = Annotated[str, Path(min_length=1, max_length=253)]
Limit = Annotated[int, Query(ge=1, le=5000)]
BigId = Annotated[int, Path(ge=1, le=2**62)]
OptId = Annotated[int | None, Query(ge=0, le=2**62)]


def create_app(service: ControlService) -> FastAPI:
    """The FastAPI application of one controller."""
    install_log_redaction()
    store = service.store
    app = FastAPI(
        title="gpufleet control plane",
        version=__version__,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
        description="Fleet state, telemetry, findings, lifecycle actions and ingest.",
    )
    app.state.service = service
    api = APIRouter(prefix="/api/v1", responses=ERRORS)

    # -- errors ---------------------------------------------------------------------------------
    @app.exception_handler(NotFound)
    async def _nf(_r: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(TransitionError)
    async def _te(_r: Request, exc: TransitionError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(UsageError)
    async def _ue(_r: Request, exc: UsageError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(PermissionError)
    async def _pe(_r: Request, exc: PermissionError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    # -- auth -----------------------------------------------------------------------------------
    def _resolve(creds: HTTPAuthorizationCredentials | None) -> Principal:
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
        who = store.tokens.resolve(creds.credentials)
        if who is None:
            raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
        return who

    def need(role: Role) -> Callable[..., Principal]:
        def dep(
            request: Request,
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        ) -> Principal:
            who = _resolve(creds)
            if not who.at_least(role):
                if request.method not in ("GET", "HEAD"):
                    store.audit_refusal(
                        who,
                        f"{request.method} {request.url.path}"[:64],
                        "",
                        f"needs role {role.value}",
                    )
                raise HTTPException(403, f"this needs role {role.value}; the token is {who.role}")
            return who

        return dep

    Viewer = Annotated[Principal, Depends(need(Role.VIEWER))]
    Operator = Annotated[Principal, Depends(need(Role.OPERATOR))]
    Admin = Annotated[Principal, Depends(need(Role.ADMIN))]

    def any_token(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        return _resolve(creds)

    def node_for(name: str, who: Principal) -> NodeCache:
        nc = store.nodes.get(name)
        if nc is None or not qy.visible(nc, who):
            raise NotFound(f"node {name!r} not found")
        return nc

    # -- reads ----------------------------------------------------------------------------------
    @api.get("/health", responses={}, tags=["meta"])
    def health() -> dict[str, str]:
        """Liveness (no token needed)."""
        return {"status": "ok", "version": __version__}

    @api.get("/whoami", tags=["meta"])
    def whoami(who: Annotated[Principal, Depends(any_token)]) -> sc.WhoAmI:
        return sc.WhoAmI(name=who.name, role=who.role.value, tenant=who.tenant, node=who.node)

    @api.get("/summary", tags=["fleet"])
    def summary(who: Viewer) -> sc.FleetSummary:
        """Counts by state, health and model; breaker and ingest figures; a generation number
        that changes whenever anything changed (poll it, or use /api/v1/stream)."""
        return qy.summary(store, who, service.ingest.pending)

    @api.get("/nodes", tags=["fleet"])
    def nodes(
        who: Viewer,
        state: Annotated[NodeState | None, Query()] = None,
        rack: Annotated[str | None, Query(max_length=128)] = None,
        model: Annotated[str | None, Query(max_length=64)] = None,
        health: Annotated[int | None, Query(ge=0, le=3)] = None,
        gpus: bool = True,
        limit: Limit = 1000,
        offset: Annotated[int, Query(ge=0, le=10**6)] = 0,
    ) -> sc.NodeList:
        """Nodes with (``gpus=true``) each GPU's newest sample."""
        sel = qy.filtered_nodes(
            store, who, state=state.value if state else None, rack=rack, model=model, health=health
        )
        page = sel[offset : offset + limit]
        return sc.NodeList(total=len(sel), nodes=[qy.node_out(store, n, gpus) for n in page])

    @api.get("/heatmap", tags=["fleet"])
    def heatmap(
        who: Viewer,
        metric: Annotated[str, Query(pattern="^(" + "|".join(qy.HEATMAP_METRICS) + ")$")] = (
            "gpu_util_pct"
        ),
        state: Annotated[NodeState | None, Query()] = None,
        rack: Annotated[str | None, Query(max_length=128)] = None,
        model: Annotated[str | None, Query(max_length=64)] = None,
    ) -> sc.Heatmap:
        """Nodes x GPUs of one metric in compact arrays (the overview's heatmap)."""
        sel = qy.filtered_nodes(
            store, who, state=state.value if state else None, rack=rack, model=model
        )
        return qy.heatmap(store, sel, metric)

    @api.get("/nodes/{name}", tags=["nodes"])
    def node(name: NodeName, who: Viewer) -> sc.NodeDetail:
        return qy.node_detail(store, node_for(name, who))

    @api.get("/nodes/{name}/transitions", tags=["nodes"])
    def node_transitions(name: NodeName, who: Viewer, limit: Limit = 200) -> list[sc.TransitionOut]:
        return qy.transitions(store, node_for(name, who).name, limit)

    @api.get("/nodes/{name}/gpus/{index}/series", tags=["nodes"])
    def gpu_series(
        name: NodeName,
        index: Annotated[int, Path(ge=0, le=1023)],
        who: Viewer,
        fields: Annotated[
            list[str] | None, Query(description="metric names; default all kept metrics")
        ] = None,
        resolution: Annotated[str, Query(pattern="^(raw|minute)$")] = "raw",
        since_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    ) -> sc.Series:
        """One GPU over time: ``raw`` from memory (recent minutes), ``minute`` from rollups."""
        names = fields or list(qy.FIELD_INDEX)
        bad = [f for f in names if f not in qy.FIELD_INDEX]
        if bad:
            raise UsageError(f"unknown field(s) {bad}; known: {list(qy.FIELD_INDEX)}")
        return qy.series(
            store, node_for(name, who), index, names, resolution=resolution, since_s=since_s
        )

    @api.get("/gpus", tags=["fleet"])
    def gpus_list(
        who: Viewer,
        node: Annotated[str | None, Query(max_length=253)] = None,
        model: Annotated[str | None, Query(max_length=64)] = None,
        limit: Limit = 1000,
        offset: Annotated[int, Query(ge=0, le=10**6)] = 0,
    ) -> list[sc.GpuOut]:
        return qy.gpus(store, who, node, model, limit, offset)

    @api.get("/findings", tags=["findings"])
    def findings(
        who: Viewer,
        node: Annotated[str | None, Query(max_length=253)] = None,
        active: bool | None = True,
        severity: Annotated[int | None, Query(ge=0, le=3)] = None,
        limit: Limit = 500,
        before_id: OptId = None,
    ) -> list[sc.FindingOut]:
        return qy.findings(
            store,
            who,
            node=node,
            active=active,
            severity=severity,
            limit=limit,
            before_id=before_id,
        )

    @api.get("/events", tags=["events"])
    def events(
        who: Viewer,
        node: Annotated[str | None, Query(max_length=253)] = None,
        kind: Annotated[str | None, Query(max_length=64)] = None,
        since_id: OptId = None,
        before_id: OptId = None,
        limit: Limit = 200,
    ) -> list[sc.EventOut]:
        """Newest first; ``since_id`` returns only newer events (for live tails)."""
        return qy.events(
            store, who, node=node, kind=kind, since_id=since_id, before_id=before_id, limit=limit
        )

    @api.get("/audit", tags=["audit"])
    def audit(who: Operator, limit: Limit = 200, before_id: OptId = None) -> list[sc.AuditOut]:
        _ = who
        return qy.audit(store, limit, before_id)

    @api.get("/policy", tags=["policy"])
    def policy_get(who: Viewer) -> RemediationPolicy:
        _ = who
        return store.policy

    # -- writes ---------------------------------------------------------------------------------
    @api.post("/nodes/{name}/actions/{action}", tags=["nodes"])
    def node_action(
        name: NodeName, action: Action, who: Operator, body: sc.ActionIn | None = None
    ) -> sc.NodeOut:
        """cordon, uncordon, drain, resume, repair, validate, fail, acknowledge."""
        node_for(name, who)
        nc = act.node_action(store, name, action, who, body.reason if body else "")
        return qy.node_out(store, nc, with_gpus=False)

    @api.patch("/nodes/{name}", tags=["nodes"])
    def node_patch(name: NodeName, body: sc.NodePatch, who: Operator) -> sc.NodeOut:
        """Set rack, tenant or labels."""
        node_for(name, who)
        nc = act.update_node(
            store, name, who, rack=body.rack, tenant=body.tenant, labels=body.labels
        )
        return qy.node_out(store, nc, with_gpus=False)

    @api.post("/findings/{finding_id}/acknowledge", tags=["findings"])
    def finding_ack(finding_id: BigId, who: Operator) -> sc.FindingOut:
        return sc.FindingOut.model_validate(act.acknowledge_finding(store, finding_id, who))

    @api.post("/validation-results", tags=["nodes"])
    def validation(
        body: sc.ValidationIn,
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        request: Request,
    ) -> sc.NodeOut:
        """A `gpufleet validate` result. Minimal shape: ``{"node", "verdict": pass|warn|fail}``;
        other fields are kept as posted. Operators, admins, or the node's own agent token."""
        who = _resolve(creds)
        if not (
            who.at_least(Role.OPERATOR) or (who.role is Role.AGENT and who.may_push_for(body.node))
        ):
            store.audit_refusal(who, f"POST {request.url.path}", body.node, "needs operator")
            raise HTTPException(403, "this needs role operator or the node's agent token")
        node_for(body.node, who)
        nc = act.post_validation(store, body.model_dump(), who)
        return qy.node_out(store, nc, with_gpus=False)

    @api.put("/policy", tags=["policy"])
    def policy_put(body: RemediationPolicy, who: Admin) -> RemediationPolicy:
        act.set_policy(store, body, who)
        return store.policy

    @api.get("/tokens", tags=["tokens"])
    def tokens(who: Admin) -> list[sc.TokenOut]:
        _ = who
        return [sc.TokenOut.model_validate(t) for t in store.tokens.list()]

    @api.post("/tokens", tags=["tokens"], status_code=201)
    def token_create(body: sc.TokenIn, who: Admin) -> sc.TokenCreated:
        """The token is shown once, in this answer; only its hash is kept."""
        token, tid = act.create_token(store, who, body.role, body.name, body.tenant, body.node)
        return sc.TokenCreated(id=tid, token=token)

    @api.delete("/tokens/{token_id}", tags=["tokens"], status_code=204)
    def token_revoke(token_id: BigId, who: Admin) -> Response:
        act.revoke_token(store, who, token_id)
        return Response(status_code=204)

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
        # Requests to this path are answered by IngestFastPath (below) before routing; this
        # route documents the endpoint and answers the same way if it is ever reached.
        reply = await handle_ingest(
            service,
            request.headers.get("authorization"),
            request.headers.get("content-encoding"),
            await request.body(),
        )
        return Response(
            reply.body, reply.status, dict(reply.headers), media_type="application/json"
        )

    @api.get("/stream", include_in_schema=False)
    async def stream(
        request: Request,
        who: Viewer,
        max_s: Annotated[float, Query(ge=1, le=86400)] = 3600.0,
    ) -> StreamingResponse:
        """Server-sent events: a ``summary`` whenever the fleet changed (checked each second),
        and the new ``events`` since the last message. EventSource cannot send headers; read it
        with fetch() and a ReadableStream (Authorization header)."""

        async def gen() -> AsyncIterator[bytes]:
            last_gen = -1
            last_event = max(
                (
                    e.id
                    for e in qy.events(
                        store, who, node=None, kind=None, since_id=None, before_id=None, limit=1
                    )
                ),
                default=0,
            )
            start = time.monotonic()
            yield b"retry: 2000\n\n"
            while time.monotonic() - start < max_s:
                if await request.is_disconnected():
                    return
                if store.generation != last_gen:
                    last_gen = store.generation
                    summ = qy.summary(store, who, service.ingest.pending).model_dump(mode="json")
                    yield f"event: summary\ndata: {json.dumps(summ)}\n\n".encode()
                    new = qy.events(
                        store,
                        who,
                        node=None,
                        kind=None,
                        since_id=last_event,
                        before_id=None,
                        limit=200,
                    )
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

    api_jobs.register(api, service, need)
    app.include_router(api)
    app.add_middleware(IngestFastPath, service=service)  # ingest skips routing (ingest_http)
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
    from gpufleet.web import static_dir

    app.mount("/", StaticFiles(directory=str(static_dir()), html=True), name="web")
    return app


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)
