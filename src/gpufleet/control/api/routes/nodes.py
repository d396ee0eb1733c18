"""Fleet and node reads (summary, node list, heatmap, one node, its transitions and series,
GPUs) from the writer's snapshot, and node writes (lifecycle actions, attributes, validation
results) sent to the writer."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request

from gpufleet.control.api.routes.deps import Auth, Creds, Limit, NodeName
from gpufleet.control.fleet import actions as act
from gpufleet.control.fleet import queries as qy
from gpufleet.control.fleet import views as fv
from gpufleet.control.series.forward import PeerAnswered, SeriesForwarder, mark
from gpufleet.control.series.source import SeriesUnavailable, make_source
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action, NodeState
from gpufleet.errors import UsageError
from gpufleet.wire import views as sc

Offset = Annotated[int, Query(ge=0, le=10**6)]
Rack = Annotated[str | None, Query(max_length=128)]
Model = Annotated[str | None, Query(max_length=64)]


def router(service: ControlService, auth: Auth) -> APIRouter:
    store = service.store
    source = make_source(service.config.prometheus_url)
    # replicas without Prometheus: a raw read goes to the replica holding the node's rings
    forward = (
        SeriesForwarder(service.config.advertise_url, ca=service.config.peer_ca)
        if service.replicated and source.kind == "memory"
        else None
    )
    api = APIRouter()
    Viewer = Annotated[Principal, auth.viewer]
    Operator = Annotated[Principal, auth.operator]

    @api.get("/summary", tags=["fleet"])
    def summary(who: Viewer) -> sc.FleetSummary:
        """Counts by state, health and model; breaker and ingest figures; a generation number
        that changes whenever anything changed (poll it, or use /api/v1/stream)."""
        return qy.summary(store, who, service.ingest.pending)

    @api.get("/nodes", tags=["fleet"])
    def nodes(
        who: Viewer,
        state: Annotated[NodeState | None, Query()] = None,
        rack: Rack = None,
        model: Model = None,
        health: Annotated[int | None, Query(ge=0, le=3)] = None,
        gpus: bool = True,
        limit: Limit = 1000,
        offset: Offset = 0,
        attention: Annotated[
            bool, Query(description="only nodes not in service, not healthy, or cordoned")
        ] = False,
        q: Annotated[
            str | None, Query(max_length=253, description="name, rack or state contains this")
        ] = None,
        sort: Annotated[
            str,
            Query(
                pattern="^(" + "|".join(fv.NODE_SORTS) + ")$",
                description="util/power/temp: mean utilisation, total power, hottest GPU "
                "(no samples last); attention: fail, unknown, warn, ok",
            ),
        ] = "name",
        desc: bool = False,
    ) -> sc.NodeList:
        """Nodes with (``gpus=true``) each GPU's newest sample; ``total`` counts the whole
        selection, ``limit``/``offset`` page it."""
        sel = qy.filtered_nodes(
            store, who, state=state.value if state else None, rack=rack, model=model, health=health
        )
        if attention:
            sel = [n for n in sel if fv.needs_attention(n)]
        if q:
            sel = fv.search(sel, q)
        if sort != "name" or desc:
            sel = fv.sort_nodes(store, sel, sort, desc)
        page = sel[offset : offset + limit]
        return sc.NodeList(total=len(sel), nodes=[qy.node_out(store, n, gpus) for n in page])

    @api.get("/heatmap", tags=["fleet"])
    def heatmap(
        who: Viewer,
        metric: Annotated[str, Query(pattern="^(" + "|".join(qy.HEATMAP_METRICS) + ")$")] = (
            "gpu_util_pct"
        ),
        state: Annotated[NodeState | None, Query()] = None,
        rack: Rack = None,
        model: Model = None,
        group_by: Annotated[
            str | None,
            Query(
                pattern="^(rack|model)$",
                description="fold nodes into one tile per rack or model (with max_cells: only "
                "when the selection has more GPU cells than that)",
            ),
        ] = None,
        max_cells: Annotated[int | None, Query(ge=0, le=10**7)] = None,
        expand: Annotated[
            list[str] | None,
            Query(max_length=64, description='groups whose nodes come as rows ("": none)'),
        ] = None,
    ) -> sc.Heatmap:
        """Nodes x GPUs of one metric in compact arrays (the overview's heatmap); with
        ``group_by``, one group per rack or model when there are more cells than the page
        can show."""
        sel = qy.filtered_nodes(
            store, who, state=state.value if state else None, rack=rack, model=model
        )
        return fv.heatmap(
            store, sel, metric, group_by=group_by, max_cells=max_cells, expand=expand or []
        )

    @api.get("/nodes/{name}", tags=["nodes"])
    def node(name: NodeName, who: Viewer) -> sc.NodeDetail:
        return qy.node_detail(store, auth.node_for(name, who))

    @api.get("/nodes/{name}/transitions", tags=["nodes"])
    def node_transitions(name: NodeName, who: Viewer, limit: Limit = 200) -> list[sc.TransitionOut]:
        return qy.transitions(store, auth.node_for(name, who).name, limit)

    @api.get("/nodes/{name}/gpus/{index}/series", tags=["nodes"])
    def gpu_series(
        name: NodeName,
        index: Annotated[int, Path(ge=0, le=1023)],
        who: Viewer,
        request: Request,
        fields: Annotated[
            list[str] | None, Query(description="metric names; default all kept metrics")
        ] = None,
        resolution: Annotated[str, Query(pattern="^(raw|minute)$")] = "raw",
        since_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    ) -> sc.Series:
        """One GPU over time: ``raw`` from memory (recent minutes), ``minute`` from rollups;
        with ``controller --prometheus-url`` both from Prometheus (503 when it does not
        answer). With replicas, a raw read is answered by the replica whose memory holds the
        node's samples (``source``, ``served_by``; ``partial`` when it could not be asked)."""
        names = fields or list(qy.FIELD_INDEX)
        bad = [f for f in names if f not in qy.FIELD_INDEX]
        if bad:
            raise UsageError(f"unknown field(s) {bad}; known: {list(qy.FIELD_INDEX)}")
        nc = auth.node_for(name, who)

        def local() -> sc.Series:
            return source.series(store, nc, index, names, resolution=resolution, since_s=since_s)

        try:
            if forward is not None and resolution == "raw":
                return forward.read(
                    store,
                    nc.name,
                    path=request.url.path,
                    query=request.url.query,
                    headers=request.headers,
                    local=local,
                )
            return mark(local(), source.kind, None)
        except SeriesUnavailable as exc:
            raise HTTPException(503, str(exc)) from None
        except PeerAnswered as exc:  # the holder's own refusal (404 for no such GPU, ...)
            raise HTTPException(exc.status, exc.detail) from None

    @api.get("/gpus", tags=["fleet"])
    def gpus_list(
        who: Viewer,
        node: Annotated[str | None, Query(max_length=253)] = None,
        model: Model = None,
        limit: Limit = 1000,
        offset: Offset = 0,
    ) -> list[sc.GpuOut]:
        return qy.gpus(store, who, node, model, limit, offset)

    @api.post("/nodes/{name}/actions/{action}", tags=["nodes"])
    def node_action(
        name: NodeName, action: Action, who: Operator, body: sc.ActionIn | None = None
    ) -> sc.NodeOut:
        """cordon, uncordon, drain, resume, repair, validate, fail, acknowledge."""
        auth.node_to_change(name, who, f"node.{action.value}")
        nc = act.node_action(store, name, action, who, body.reason if body else "")
        return qy.node_out(store, nc, with_gpus=False)

    @api.patch("/nodes/{name}", tags=["nodes"])
    def node_patch(name: NodeName, body: sc.NodePatch, who: Operator) -> sc.NodeOut:
        """Set rack, tenant or labels (the tenant: global admins only)."""
        auth.node_to_change(name, who, "node.update")
        if body.tenant is not None and not (who.is_global and who.at_least(Role.ADMIN)):
            store.audit_refusal(who, "node.update", name, "re-tenanting needs a global admin")
            raise HTTPException(403, "changing a node's tenant needs a global admin token")
        nc = act.update_node(
            store, name, who, rack=body.rack, tenant=body.tenant, labels=body.labels
        )
        return qy.node_out(store, nc, with_gpus=False)

    @api.post("/validation-results", tags=["nodes"])
    def validation(body: sc.ValidationIn, creds: Creds, request: Request) -> sc.NodeOut:
        """A `gpufleet validate` result. Minimal shape: ``{"node", "verdict": pass|warn|fail}``;
        other fields are kept as posted. Operators, admins, or the node's own agent token."""
        who = auth.resolve(creds)
        nc = store.view.nodes.get(body.node)
        own_agent = who.role is Role.AGENT and who.may_push_for(
            body.node, nc.tenant if nc else None, nc is not None
        )
        if not (who.at_least(Role.OPERATOR) or own_agent):
            store.audit_refusal(who, f"POST {request.url.path}", body.node, "needs operator")
            raise HTTPException(403, "this needs role operator or the node's agent token")
        auth.node_to_change(body.node, who, "validation.post")
        nc = act.post_validation(store, body.model_dump(), who)
        return qy.node_out(store, nc, with_gpus=False)

    return api
