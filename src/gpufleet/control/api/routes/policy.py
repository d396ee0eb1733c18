"""The remediation policy: read (viewer), replace (a global admin: it governs the whole
fleet)."""

from typing import Annotated

from fastapi import APIRouter

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.fleet import actions as act
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.control.state.store import ControlStore


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()

    @api.get("/policy", tags=["policy"])
    def policy_get(who: Annotated[Principal, auth.viewer]) -> RemediationPolicy:
        _ = who
        return store.view.policy

    @api.put("/policy", tags=["policy"])
    def policy_put(
        body: RemediationPolicy, who: Annotated[Principal, auth.admin]
    ) -> RemediationPolicy:
        auth.global_only(who, "policy.update", "remediation")
        act.set_policy(store, body, who)
        return store.view.policy

    return api
