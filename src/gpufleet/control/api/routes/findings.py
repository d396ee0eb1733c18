"""Findings (list, acknowledge), the event log and the audit log."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.control.api.routes.deps import Auth, BigId, Limit, OptId
from gpufleet.control.fleet import actions as act
from gpufleet.control.fleet import queries as qy
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore, NotFound
from gpufleet.wire import views as sc

NodeQ = Annotated[str | None, Query(max_length=253)]


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()
    Viewer = Annotated[Principal, auth.viewer]
    Operator = Annotated[Principal, auth.operator]

    @api.get("/findings", tags=["findings"])
    def findings(
        who: Viewer,
        node: NodeQ = None,
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

    @api.post("/findings/{finding_id}/acknowledge", tags=["findings"])
    def finding_ack(finding_id: BigId, who: Operator) -> sc.FindingOut:
        """Acknowledge one finding (a tenant token: of its tenant's nodes only)."""
        node = qy.finding_node(store, finding_id)
        if node is None:
            raise NotFound(f"finding {finding_id} not found")
        try:
            auth.node_to_change(node, who, "finding.acknowledge")
        except NotFound as exc:
            raise NotFound(f"finding {finding_id} not found") from exc
        return sc.FindingOut.model_validate(act.acknowledge_finding(store, finding_id, who))

    @api.get("/events", tags=["events"])
    def events(
        who: Viewer,
        node: NodeQ = None,
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
        """Newest first; a tenant token reads the rows its tenant's tokens wrote."""
        return qy.audit(store, who, limit, before_id)

    return api
