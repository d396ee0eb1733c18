"""Maintenance campaigns (issue 15): start, pause, resume, abort (operators and admins), read
status (viewers), and the agents' update reports."""

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path
from fastapi.exceptions import RequestValidationError

from gpufleet.control.api.routes.deps import ERRORS, Auth
from gpufleet.control.campaigns import ops
from gpufleet.control.campaigns import propose as campaign_propose
from gpufleet.control.campaigns.engine import CampaignSpec
from gpufleet.control.campaigns.spec import baseline_pair_errors
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore
from gpufleet.wire import WireUpdateReport

CampaignId = Annotated[int, Path(ge=1, le=2**31)]


def scoped_status(
    doc: dict[str, Any], who: Principal, tenant_of: Callable[[str], str | None]
) -> dict[str, Any]:
    """A campaign's status as ``who`` may read it: a tenant token sees only the nodes it sees
    (its tenant's and shared ones), step counts over those, and not the fleet's capacity."""
    if who.is_global:
        return doc
    nodes = [n for n in doc["nodes"] if who.sees(tenant_of(n["node"]))]
    by_step: dict[str, int] = {}
    for n in nodes:
        by_step[n["step"]] = by_step.get(n["step"], 0) + 1
    return {**doc, "nodes": nodes, "by_step": by_step, "capacity": None}


def _tenant_of(store: ControlStore) -> Callable[[str], str | None]:
    def tenant_of(node: str) -> str | None:
        view = store.view.nodes.get(node)
        return view.tenant if view is not None else None

    return tenant_of


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter(prefix="/maintenance", tags=["maintenance"], responses=ERRORS)

    @api.post("/campaigns", status_code=201)
    def start(body: CampaignSpec, who: Annotated[Principal, auth.operator]) -> dict[str, Any]:
        auth.global_only(who, "maintenance.start", "campaign")
        if errors := baseline_pair_errors(body.baseline):  # a pair no driver reports: 422
            raise RequestValidationError(errors)
        cid = ops.start(store, body, who)
        return ops.status(store, cid)

    tenant_of = _tenant_of(store)

    @api.get("/campaigns")
    def listing(who: Annotated[Principal, auth.viewer]) -> list[dict[str, Any]]:
        """The newest 50 campaigns (proposed ones included), with node counts per step."""
        if who.is_global:
            return ops.campaigns(store)
        # a tenant token: step counts over the nodes it sees, in the one query
        return ops.campaigns(store, visible=lambda node: who.sees(tenant_of(node)))

    @api.get("/policy")
    def policy(who: Annotated[Principal, auth.viewer]) -> dict[str, Any]:
        """The recurring maintenance policy (without its baseline and command) and its next
        occurrence; ``policy`` is null when none is set."""
        _ = who
        p = store.policy.maintenance
        if p is None:
            return {"policy": None, "next": None}
        shown = p.model_dump(mode="json", exclude={"baseline", "update_command"})
        return {"policy": shown, "next": campaign_propose.next_occurrence(p, store.clock())}

    @api.get("/campaigns/latest")
    def latest(who: Annotated[Principal, auth.viewer]) -> dict[str, Any]:
        return scoped_status(ops.status(store), who, tenant_of)

    @api.get("/campaigns/{cid}")
    def one(cid: CampaignId, who: Annotated[Principal, auth.viewer]) -> dict[str, Any]:
        return scoped_status(ops.status(store, cid), who, tenant_of)

    @api.post("/campaigns/{cid}/{action}")
    def control(
        cid: CampaignId,
        action: Literal["start", "pause", "resume", "abort"],
        who: Annotated[Principal, auth.operator],
    ) -> dict[str, Any]:
        auth.global_only(who, f"maintenance.{action}", f"campaign:{cid}")
        ops.control(store, cid, action, who)
        return ops.status(store, cid)

    @api.post("/reports")
    def report(
        body: WireUpdateReport, who: Annotated[Principal, Depends(auth.any_token)]
    ) -> dict[str, bool]:
        return {"accepted": ops.report(store, body, who)}

    return api
