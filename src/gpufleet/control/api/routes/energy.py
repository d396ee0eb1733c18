"""Energy reports (issue 16): ``GET /api/v1/energy?by=job|tenant|node|model|day&since=30d``.
A tenant token reads only its own tenant's energy and jobs."""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.energy import query as eq
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal


def router(service: ControlService, auth: Auth) -> APIRouter:
    api = APIRouter()

    @api.get("/energy", tags=["energy"])
    def energy(
        who: Annotated[Principal, auth.viewer],
        by: Annotated[str, Query(pattern="^(" + "|".join(eq.BY) + ")$")] = "tenant",
        since: Annotated[
            str, Query(max_length=16, description="how far back: 30d, 12h, 90m, 3600s, 2w")
        ] = "30d",
    ) -> dict[str, Any]:
        """Energy per job, tenant, node, GPU model or day since ``since``: kWh, GPU-hours,
        how it was measured (``counter``, ``power`` or ``mixed``), cost and CO2 when the
        policy has a price and a grid intensity, and the idle waste (in-service GPUs below
        the policy's ``idle_util_pct``: kWh, GPU-hours, cost). ``total`` is the energy of
        every GPU the token may see since ``since``, also for ``by=job`` (so it includes
        time no job held a GPU)."""
        seconds = eq.parse_since(since)
        now = service.clock()
        return eq.report(service.store, who, by, seconds, now, service.scheduler)

    return api
