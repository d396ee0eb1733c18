"""The maintenance campaign engine (issue 15): moves each node of a running campaign through

::

    selected -> cordoned -> draining [-> evacuating] -> updating -> rebooting -> verifying
             -> validating -> done
                                  any step in flight -> failed (node to repair, with the reason)
          selected/cordoned/draining/evacuating -> skipped (abort, halt or drain timeout)

``evacuating``: the drain's deadline passed with jobs still running; they were
checkpoint-signalled and requeued (`gpufleet.control.campaigns.drain`). A node that goes
lost while draining or evacuating is waited for (a lost spell may end; it comes back draining)
until that step's timeout, then given back: it returns through validation, not held out by a
campaign that let it go. A node that goes to repair or failed is given back at once.

It runs on the writer thread (`gpufleet.control.state.writer`), one pass per controller tick
(`tick`), and never waits on anything but the database. Each node's step change is one
transaction holding the node's lifecycle change, the campaign row, one ``maint_steps`` row
(unique per campaign, node and step), one audit row and one event: a controller killed at any
moment either took a step completely or not at all, so after a restart the campaign resumes
from the database with nothing taken twice. The update itself runs once per node: its order
carries a key the agent keeps (`gpufleet.agent.maintenance`).

Capacity: a node starts only when the campaign is running, a window is open, fewer than
``batch`` nodes are in flight (at most ``per_domain`` in one failure domain), taking its GPUs
out keeps in-service GPUs at or above ``floor`` of the fleet's, and the circuit breaker's
budget (`gpufleet.control.state.remediation.allowed_out`) still has room, counting every node in
flight (cordoned, draining, updating...) as out.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.control.campaigns import steps
from gpufleet.control.campaigns.spec import (
    ABORTED,
    BEFORE_UPDATE,
    CORDONED,
    DONE,
    DRAINING,
    EVACUATING,
    FAILED,
    FINAL_STEPS,
    HALTED,
    IN_FLIGHT,
    LIVE_CAMPAIGN,
    LOST_CODES,
    NODE_DONE,
    PAUSED,
    PROPOSED,
    REBOOTING,
    RUNNING,
    SELECTED,
    SKIPPED,
    UPDATING,
    VALIDATING,
    VERIFYING,
    CampaignSpec,
    StepChange,
    deviations,
    gpu_infos,
    update_key,
)
from gpufleet.control.db.models import (
    EventRow,
    MaintCampaign,
    MaintNode,
    MaintStep,
)
from gpufleet.control.state.lifecycle import OUT_STATES, NodeState
from gpufleet.control.state.remediation import allowed_out
from gpufleet.maintenance.windows import parse_schedule

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

__all__ = [
    "ABORTED",
    "BEFORE_UPDATE",
    "CORDONED",
    "DONE",
    "DRAINING",
    "EVACUATING",
    "FAILED",
    "FINAL_STEPS",
    "HALTED",
    "IN_FLIGHT",
    "LIVE_CAMPAIGN",
    "LOST_CODES",
    "NODE_DONE",
    "PAUSED",
    "PROPOSED",
    "REBOOTING",
    "RUNNING",
    "SELECTED",
    "SKIPPED",
    "UPDATING",
    "VALIDATING",
    "VERIFYING",
    "CampaignSpec",
    "StepChange",
    "capacity",
    "deviations",
    "gpu_infos",
    "in_flight_nodes",
    "tick",
    "update_key",
]
log = logging.getLogger("gpufleet.control.campaigns")
S = NodeState


# -- the pass ----------------------------------------------------------------------------------
def tick(store: ControlStore) -> list[StepChange]:
    """One pass over every live campaign (on the writer)."""
    changes: list[StepChange] = []
    with store.sessions() as s:
        ids = list(
            s.scalars(
                select(MaintCampaign.id)
                .where(MaintCampaign.state.in_(LIVE_CAMPAIGN))
                .order_by(MaintCampaign.id)
            )
        )
    for cid in ids:
        _tick_campaign(store, cid, changes)
    if changes:
        store.bump()
    return changes


def _tick_campaign(store: ControlStore, cid: int, changes: list[StepChange]) -> None:
    before = len(changes)
    with store.sessions() as s:
        state = s.scalar(select(MaintCampaign.state).where(MaintCampaign.id == cid))
        # selected nodes only need a pass when the campaign stopped (they are skipped)
        waiting = FINAL_STEPS if state in (HALTED, ABORTED) else FINAL_STEPS | {SELECTED}
        names = list(
            s.scalars(
                select(MaintNode.node)
                .where(MaintNode.campaign_id == cid, MaintNode.step.not_in(waiting))
                .order_by(MaintNode.ord)
            )
        )
    spec = _spec(store, cid)  # parsed once a pass, not once a node
    for name in names:
        _one(store, cid, spec, name, changes)
    _start_nodes(store, cid, spec, changes)
    with store.sessions.begin() as s:
        c = s.get(MaintCampaign, cid)
        assert c is not None
        if len(changes) > before:
            _sample_capacity(store, s, cid)
        left = s.scalars(
            select(MaintNode.node).where(
                MaintNode.campaign_id == cid, MaintNode.step.not_in(FINAL_STEPS)
            )
        ).first()
        if left is not None or (c.state in (HALTED, ABORTED) and not names):
            return  # nodes in flight, or ended earlier: nothing more to say
        if c.state in (RUNNING, PAUSED):
            c.state, c.reason = DONE, "every node went through the campaign"
        c.updated_s = store.clock()
        s.add(
            EventRow(
                at_s=store.clock(),
                kind="maintenance_finished",
                message=f"campaign {cid} ended: {c.state} ({c.failures} failure(s))",
                data={"campaign": cid, "state": c.state, "failures": c.failures},
            )
        )


def _sample_capacity(store: ControlStore, s: Session, cid: int) -> None:
    """The in-service and fleet GPUs after a pass that took steps, kept on the pass's last
    ``maint_steps`` row (the dashboard's capacity chart, `campaign_ops.capacity_history`):
    one fleet-wide count per pass, not per step (the count reads every node)."""
    row = s.scalars(
        select(MaintStep).where(MaintStep.campaign_id == cid).order_by(MaintStep.id.desc())
    ).first()
    if row is not None:
        row.detail = {**(row.detail or {}), "capacity": list(capacity(store, s)[:2])}


def _spec(store: ControlStore, cid: int) -> CampaignSpec:
    with store.sessions() as s:
        c = s.get(MaintCampaign, cid)
        assert c is not None
        return CampaignSpec.model_validate(c.spec)


def _one(
    store: ControlStore, cid: int, spec: CampaignSpec, name: str, changes: list[StepChange]
) -> None:
    """Advance one node by at most one step, in its own unit of work (`steps.advance`)."""
    with store.unit_of_work(bump=False) as uow:
        c = uow.s.get(MaintCampaign, cid)
        mn = uow.s.get(MaintNode, (cid, name))
        assert c is not None and mn is not None
        nc = store.nodes.get(name)
        steps.advance(steps.NodePass(uow, c, mn, nc, spec, changes, store.clock()))


# -- starting nodes ----------------------------------------------------------------------------
def _start_nodes(
    store: ControlStore, cid: int, spec: CampaignSpec, changes: list[StepChange]
) -> None:
    """Start selected nodes (-> cordoned) while the window is open and capacity allows."""
    with store.unit_of_work(bump=False) as uow:
        s = uow.s
        c = s.get(MaintCampaign, cid)
        assert c is not None
        if c.state != RUNNING:
            return
        schedule = parse_schedule(spec.windows or None)
        now = datetime.fromtimestamp(store.clock(), UTC)
        if schedule.open_until(now) is None:
            return
        rows = list(
            s.scalars(select(MaintNode).where(MaintNode.campaign_id == cid).order_by(MaintNode.ord))
        )
        flight = [m for m in rows if m.step in IN_FLIGHT]
        in_gpus, total_gpus, out_nodes, total_nodes = capacity(store, s)
        p = store.policy
        budget = allowed_out(total_nodes, p.max_out_fraction, p.min_out_nodes)
        floor_gpus = spec.floor * total_gpus - 1e-9
        for mn in rows:
            if mn.step != SELECTED:
                continue
            if len(flight) >= spec.batch:
                break
            nc = store.nodes.get(mn.node)
            if nc is None or nc.state not in (S.IN_SERVICE.value, S.DRAINED.value):
                continue  # not startable now (validating, lost...): try again later
            if sum(1 for m in flight if m.domain == mn.domain) >= spec.per_domain:
                continue
            if nc.state == S.IN_SERVICE.value:
                if in_gpus - len(nc.gpus) < floor_gpus or out_nodes + 1 > budget:
                    continue  # below the floor, or past the circuit breaker
                in_gpus -= len(nc.gpus) if not nc.cordoned else 0
                out_nodes += 1
            steps.set_cordon(uow, nc, True, c.id)
            steps.take_step(uow, c, mn, CORDONED, "cordoned: no new work", changes)
            flight.append(mn)


def in_flight_nodes(s: Session) -> set[str]:
    """Nodes some live campaign has cordoned, drained or is updating (they count as out)."""
    q = (
        select(MaintNode.node)
        .join(MaintCampaign, MaintCampaign.id == MaintNode.campaign_id)
        .where(MaintCampaign.state.in_(LIVE_CAMPAIGN), MaintNode.step.in_(IN_FLIGHT))
    )
    return set(s.scalars(q))


def capacity(store: ControlStore, s: Session) -> tuple[int, int, int, int]:
    """(in-service GPUs, fleet GPUs, nodes out, fleet nodes) with campaign nodes counted out."""
    busy = in_flight_nodes(s)
    total_gpus = in_gpus = out_nodes = 0
    for nc in store.nodes.values():
        n = len(nc.gpus)
        total_gpus += n
        out = nc.state in OUT_STATES or nc.name in busy
        out_nodes += out
        if nc.state == S.IN_SERVICE.value and not out and not nc.cordoned:
            in_gpus += n
    return in_gpus, total_gpus, out_nodes, len(store.nodes)
