"""``/health`` (no token) and ``/whoami``."""

from typing import Annotated

from fastapi import APIRouter, Depends

from gpufleet import __version__
from gpufleet.control import schemas as sc
from gpufleet.control.auth import Principal
from gpufleet.control.routes.deps import Auth


def router(auth: Auth) -> APIRouter:
    api = APIRouter()

    @api.get("/health", responses={}, tags=["meta"])
    def health() -> dict[str, str]:
        """Liveness (no token needed)."""
        return {"status": "ok", "version": __version__}

    @api.get("/whoami", tags=["meta"])
    def whoami(who: Annotated[Principal, Depends(auth.any_token)]) -> sc.WhoAmI:
        return sc.WhoAmI(name=who.name, role=who.role.value, tenant=who.tenant, node=who.node)

    return api
