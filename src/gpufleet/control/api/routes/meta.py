"""``/health`` (no token), ``/whoami`` and ``/leader`` (this replica's side of the leader
election, issue 18)."""

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends

from gpufleet import __version__
from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.state.auth import Principal, Role
from gpufleet.wire import views as sc

if TYPE_CHECKING:
    from gpufleet.control.service import ControlService


def router(auth: Auth, service: "ControlService") -> APIRouter:
    api = APIRouter()

    @api.get("/health", responses={}, tags=["meta"])
    def health() -> dict[str, str]:
        """Liveness (no token needed); ``role``: whether this replica leads now."""
        role = "leader" if service.leading else "follower"
        return {"status": "ok", "version": __version__, "role": role}

    @api.get("/leader", tags=["meta"])
    def leader(_who: Annotated[Principal, Depends(auth.need(Role.VIEWER))]) -> dict[str, Any]:
        """This replica in the leader election: whether it leads, its epoch (the fencing
        token), the writes the token refused it, the lease and renewal periods."""
        return {**service.leader.describe(), "replicated": service.replicated}

    @api.get("/whoami", tags=["meta"])
    def whoami(who: Annotated[Principal, Depends(auth.any_token)]) -> sc.WhoAmI:
        return sc.WhoAmI(name=who.name, role=who.role.value, tenant=who.tenant, node=who.node)

    return api
