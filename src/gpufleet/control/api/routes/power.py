"""Fleet-wide power limits (issue 16): orders (operators and admins; a tenant token only on its
own nodes), their status (viewers), restore, the agents' reports, and a rack's power budget
proposal (global tokens: a rack is shared infrastructure)."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from gpufleet.control.api.routes.deps import ERRORS, Auth
from gpufleet.control.energy import savings
from gpufleet.control.power import ops
from gpufleet.control.power.spec import PowerOrderSpec
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.store import ControlStore, NotFound
from gpufleet.errors import UsageError
from gpufleet.schedulers.base import SchedulerBackend
from gpufleet.wire import WirePowerReport

OrderId = Annotated[int, Path(ge=1, le=2**31)]


def budget_gpus(store: ControlStore, rack: str) -> list[Any]:
    """The GPUs of a rack (or of a row: racks ``r1,r2,...``) as the controller last saw them
    (catalog models known)."""
    from gpufleet.catalog import load_catalog
    from gpufleet.energy.budget import BudgetGpu

    racks = {r.strip() for r in rack.split(",") if r.strip()}
    out = []
    for nc in sorted(store.view.nodes.values(), key=lambda n: n.name):
        if nc.rack not in racks:
            continue
        for i, g in sorted(nc.gpus.items()):
            if g.model is None or load_catalog().find_gpu(g.model) is None:
                raise UsageError(f"{nc.name} GPU {i}: model {g.model!r} is not in the catalog")
            out.append(BudgetGpu(nc.name, i, g.model))
    return out


def router(store: ControlStore, auth: Auth, scheduler: SchedulerBackend | None = None) -> APIRouter:
    """The ``/power`` routes; an order's status carries its ``savings``
    (`gpufleet.control.energy.savings`: the jobs' energy and throughput before and during)."""
    api = APIRouter(prefix="/power", tags=["power"], responses=ERRORS)

    def readable(doc: dict[str, Any], who: Principal) -> dict[str, Any]:
        if not who.is_global and doc["tenant"] != who.tenant:
            raise NotFound(f"power order {doc['id']} not found")
        return doc

    @api.post("/orders", status_code=201)
    def create(body: PowerOrderSpec, who: Annotated[Principal, auth.operator]) -> dict[str, Any]:
        if body.dry_run:
            return ops.plan(store, body, who)
        return ops.status(store, ops.create(store, body, who))

    @api.get("/orders")
    def listing(
        who: Annotated[Principal, auth.viewer],
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> dict[str, Any]:
        return {"orders": savings.attach(store, ops.listing(store, who, limit), scheduler)}

    @api.get("/orders/{oid}")
    def one(oid: OrderId, who: Annotated[Principal, auth.viewer]) -> dict[str, Any]:
        doc = readable(ops.status(store, oid), who)
        return savings.attach(store, [doc], scheduler)[0]

    @api.post("/orders/{oid}/restore")
    def restore(oid: OrderId, who: Annotated[Principal, auth.operator]) -> dict[str, Any]:
        ops.restore(store, oid, who)
        return ops.status(store, oid)

    @api.post("/reports")
    def report(
        body: WirePowerReport, who: Annotated[Principal, Depends(auth.any_token)]
    ) -> dict[str, bool]:
        return {"accepted": ops.report(store, body, who)}

    @api.get("/budget")
    def budget(
        who: Annotated[Principal, auth.viewer],
        rack: Annotated[str, Query(min_length=1, max_length=4096)],
        watts: Annotated[float, Query(gt=0, le=10_000_000)],
        workload: Annotated[str, Query(pattern="^(matmul-bf16|hbm|llm-inference)$")] = (
            "matmul-bf16"
        ),
    ) -> dict[str, Any]:
        from gpufleet.energy.budget import propose

        auth.global_only(who, "power.budget", f"rack:{rack}")
        gpus = budget_gpus(store, rack)
        if not gpus:
            raise NotFound(f"rack {rack!r} has no GPU the controller knows")
        return propose(gpus, watts, workload).to_json(rack)

    return api
