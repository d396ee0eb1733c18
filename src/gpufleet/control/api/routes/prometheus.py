"""``GET /prometheus/sd``: the agents as Prometheus HTTP service discovery targets
(`gpufleet.control.fleet.prometheus_sd`), for the nodes the token may see."""

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.db.models import Node
from gpufleet.control.fleet import queries as qy
from gpufleet.control.fleet.prometheus_sd import DEFAULT_AGENT_PORT, SdNode, targets
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()
    Viewer = Annotated[Principal, auth.viewer]

    @api.get("/prometheus/sd", tags=["fleet"])
    def prometheus_sd(
        who: Viewer,
        port: Annotated[int, Query(ge=1, le=65535)] = DEFAULT_AGENT_PORT,
    ) -> list[dict[str, Any]]:
        """Prometheus HTTP SD: one target group per node, its agent at ``NODE:PORT`` or its
        ``metrics_address`` label; ``__meta_gpufleet_{node,state,rack,tenant,model}`` labels.
        Point ``http_sd_configs`` here with a viewer token (`gpufleet config prometheus`)."""
        with store.sessions() as s:
            labels = {n: lab for n, lab in s.execute(select(Node.name, Node.labels)).all()}
        view = store.view.nodes
        nodes = [
            SdNode(nc.name, nc.state, nc.rack, nc.tenant, nc.model, labels.get(nc.name) or {})
            for nc in view.values()
            if qy.visible(nc, who)
        ]
        return targets(nodes, port)

    return api
