"""API tokens (admin): list, create (the token is shown once), revoke."""

from typing import Annotated

from fastapi import APIRouter, Response

from gpufleet.control import actions as act
from gpufleet.control import schemas as sc
from gpufleet.control.auth import Principal
from gpufleet.control.routes.deps import Auth, BigId
from gpufleet.control.store import ControlStore


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()
    Admin = Annotated[Principal, auth.admin]

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

    return api
