"""What every router shares: bearer-token resolution, role checks (refused writes are audited),
visibility and ownership of a node for a token (tenants), path and query types, and the
documented error answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpufleet.control.fleet import queries as qy
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.store import ControlStore, NodeView, NotFound
from gpufleet.wire import views as sc

bearer = HTTPBearer(auto_error=False, description="gpufleet API token (gf_...)")
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": sc.Problem, "description": "missing or unknown token"},
    403: {"model": sc.Problem, "description": "the token's role or tenant may not do this"},
    404: {"model": sc.Problem, "description": "no such node, finding or token"},
    409: {"model": sc.Problem, "description": "lifecycle transition not allowed"},
    422: {"model": sc.Problem, "description": "malformed request"},
}
NodeName = Annotated[str, Path(min_length=1, max_length=253)]
Limit = Annotated[int, Query(ge=1, le=5000)]
BigId = Annotated[int, Path(ge=1, le=2**62)]
OptId = Annotated[int | None, Query(ge=0, le=2**62)]
Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


class Auth:
    """Token checks over one store; ``viewer``/``operator``/``admin`` are ready-made
    dependencies (use them as ``Annotated[Principal, auth.viewer]``)."""

    def __init__(self, store: ControlStore) -> None:
        self.store = store
        self.viewer = Depends(self.need(Role.VIEWER))
        self.operator = Depends(self.need(Role.OPERATOR))
        self.admin = Depends(self.need(Role.ADMIN))

    def resolve(self, creds: HTTPAuthorizationCredentials | None) -> Principal:
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
        who = self.store.tokens.resolve(creds.credentials)
        if who is None:
            raise HTTPException(401, "unknown or revoked token", {"WWW-Authenticate": "Bearer"})
        return who

    def need(self, role: Role) -> Callable[..., Principal]:
        """A dependency that admits tokens of ``role`` or above (refused writes audited)."""

        def dep(request: Request, creds: Creds) -> Principal:
            who = self.resolve(creds)
            if not who.at_least(role):
                if request.method not in ("GET", "HEAD"):
                    self.store.audit_refusal(
                        who,
                        f"{request.method} {request.url.path}"[:64],
                        "",
                        f"needs role {role.value}",
                    )
                raise HTTPException(403, f"this needs role {role.value}; the token is {who.role}")
            return who

        return dep

    def any_token(self, creds: Creds) -> Principal:
        return self.resolve(creds)

    def node_for(self, name: str, who: Principal) -> NodeView:
        """The node as ``who`` may see it (404 for another tenant's node)."""
        nc = self.store.view.nodes.get(name)
        if nc is None or not qy.visible(nc, who):
            raise NotFound(f"node {name!r} not found")
        return nc

    def node_to_change(self, name: str, who: Principal, doing: str) -> NodeView:
        """The node, when ``who`` may change it: 404 when it may not see it, 403 (audited) for
        a node it sees but does not own (a shared node, for a tenant token)."""
        nc = self.node_for(name, who)
        if not who.owns(nc.tenant):
            self.store.audit_refusal(who, doing, name, "shared node; token is bound to a tenant")
            raise HTTPException(
                403, f"node {name!r} is shared: a token of tenant {who.tenant!r} may not change it"
            )
        return nc

    def global_only(self, who: Principal, doing: str, target: str = "") -> None:
        """403 (audited) unless ``who`` is a global token (no tenant)."""
        if not who.is_global:
            self.store.audit_refusal(who, doing, target, "needs a global token")
            raise HTTPException(
                403, f"{doing} needs a token of no tenant; this one is of tenant {who.tenant!r}"
            )
