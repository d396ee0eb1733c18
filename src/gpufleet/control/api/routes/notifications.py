"""``/notifications/status`` (issue 29): the notification outbox per receiver, for global
operators and admins (receivers are the controller's, not a tenant's)."""

from typing import Annotated

from fastapi import APIRouter, HTTPException

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.notify import outbox
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore
from gpufleet.wire import views as sc


def router(store: ControlStore, auth: Auth) -> APIRouter:
    api = APIRouter()
    Operator = Annotated[Principal, auth.operator]

    @api.get("/notifications/status", tags=["notifications"])
    def notifications_status(who: Operator) -> sc.NotifyStatus:
        """Per receiver: pending, in flight, delivered, failed attempts, dead-lettered, the
        oldest pending notification's age and the last error, read from the outbox table (so
        any replica answers for all of them)."""
        if not who.is_global:
            raise HTTPException(403, "notification status needs a global operator or admin token")
        now = store.clock()
        with store.sessions() as s:
            rows = outbox.status(s, now)
        return sc.NotifyStatus(
            at_s=now, receivers=[sc.NotifyReceiverStatus.model_validate(r) for r in rows]
        )

    return api
