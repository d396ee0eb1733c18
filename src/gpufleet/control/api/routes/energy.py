"""Energy reports (issue 16): ``GET /api/v1/energy?by=job|tenant|node|model|day&since=30d``,
with what the power orders in force in the window saved (issue 31), and ``POST
/api/v1/energy/progress``, a job's work done so far (its throughput, for the orders' slowdown).
A tenant token reads only its own tenant's energy, jobs and orders."""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gpufleet.control.api.routes.deps import Auth
from gpufleet.control.energy import progress, savings
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
        time no job held a GPU). ``power_orders``: each power order in force since
        ``since``, its GPUs' mean power in the hour before it against during it (from
        ``since``), the energy and cost saved and the jobs' slowdown (None: unknown, no
        progress reported; docs/energy.md)."""
        seconds = eq.parse_since(since)
        now = service.clock()
        doc = eq.report(service.store, who, by, seconds, now, service.scheduler)
        doc["power_orders"] = savings.in_window(
            service.store, who, now - seconds, now, service.scheduler
        )
        return doc

    @api.post("/energy/progress", tags=["energy"])
    def job_progress(
        body: progress.ProgressIn, who: Annotated[Principal, auth.operator]
    ) -> dict[str, bool]:
        """A job's work done so far (a cumulative count in its own ``unit``), at ``at_s``
        (default now): two readings give its throughput, which a power order's slowdown is
        measured by. ``accepted`` is false for a reading within 10 s of the job's previous
        one (not stored)."""
        return {"accepted": progress.record(service.store, body, who, service.scheduler)}

    return api
