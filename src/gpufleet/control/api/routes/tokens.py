"""API tokens (admin): list, create (the token is shown once), revoke. A tenant's admin lists,
makes and revokes its tenant's tokens only; only a global admin makes global tokens."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Response

from gpufleet.control.api.routes.deps import Auth, BigId
from gpufleet.control.fleet import actions as act
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore, NotFound
from gpufleet.wire import views as sc


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()
    Admin = Annotated[Principal, auth.admin]

    @api.get("/tokens", tags=["tokens"])
    def tokens(who: Admin) -> list[sc.TokenOut]:
        return [
            sc.TokenOut.model_validate(t)
            for t in store.tokens.list()
            if who.is_global or t.tenant == who.tenant
        ]

    @api.post("/tokens", tags=["tokens"], status_code=201)
    def token_create(body: sc.TokenIn, who: Admin) -> sc.TokenCreated:
        """The token is shown once, in this answer; only its hash is kept. A tenant admin's
        tokens are of its tenant (``tenant`` may be left out)."""
        tenant = body.tenant if who.is_global else (body.tenant or who.tenant)
        if not who.may_mint(tenant):
            store.audit_refusal(who, "token.create", body.name, f"tenant {tenant!r} not its own")
            raise HTTPException(
                403, f"a token of tenant {who.tenant!r} makes tokens of that tenant only"
            )
        if body.node is not None and not who.is_global:
            auth.node_to_change(body.node, who, "token.create")
        token, tid = act.create_token(store, who, body.role, body.name, tenant, body.node)
        return sc.TokenCreated(id=tid, token=token)

    @api.delete("/tokens/{token_id}", tags=["tokens"], status_code=204)
    def token_revoke(token_id: BigId, who: Admin) -> Response:
        if not who.is_global:
            row = next((t for t in store.tokens.list() if t.id == token_id), None)
            if row is None or row.tenant != who.tenant:
                store.audit_refusal(who, "token.revoke", str(token_id), "not its tenant's")
                raise NotFound(f"token {token_id} not found or already revoked")
        act.revoke_token(store, who, token_id)
        return Response(status_code=204)

    return api
