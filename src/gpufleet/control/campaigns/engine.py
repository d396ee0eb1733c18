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
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.control.campaigns import drain as drain_ops
from gpufleet.control.campaigns.spec import (
    ABORTED,
    BEFORE_UPDATE,
    CORDONED,
    DONE,
    DRAINING,
    EVACUATE_SLACK_S,
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
    AuditEntry,
    EventRow,
    MaintCampaign,
    MaintNode,
    MaintStep,
    Node,
    Transition,
)
from gpufleet.control.state import lifecycle as lc
from gpufleet.control.state import transitions as tr
from gpufleet.control.state.lifecycle import OUT_STATES, NodeState
from gpufleet.control.state.remediation import allowed_out
from gpufleet.maintenance.windows import parse_schedule

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore, NodeCache

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


# -- one step ----------------------------------------------------------------------------------
def _take(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    mn: MaintNode,
    step: str,
    reason: str,
    changes: list[StepChange],
    detail: dict[str, Any] | None = None,
) -> None:
    """Record ``mn`` entering ``step``: node row, step row (unique key), audit row, event."""
    now = store.clock()
    mn.step, mn.step_since_s, mn.reason = step, now, reason
    c.updated_s = now
    actor = f"campaign:{c.id}"
    data = {"campaign": c.id, "step": step, **(detail or {})}
    s.add(MaintStep(campaign_id=c.id, node=mn.node, step=step, at_s=now, detail=data))
    s.add(
        AuditEntry(
            at_s=now,
            actor=actor,
            role="operator",
            action=f"maintenance.{step}",
            target=mn.node,
            outcome="failed" if step == FAILED else "ok",
            detail={"reason": reason, **data},
        )
    )
    s.add(
        EventRow(
            at_s=now,
            node=mn.node,
            kind="maintenance_step",
            severity=2 if step == FAILED else 0,
            message=f"campaign {c.id}: {step}: {reason}",
            data=data,
        )
    )
    changes.append(StepChange(c.id, mn.node, step, reason))


def _move(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    nc: NodeCache,
    to: NodeState,
    reason: str,
    after: lc.PostCommit,
) -> None:
    if nc.state != to.value:
        tr.move(store, s, nc, to, actor=f"campaign:{c.id}", reason=reason, after=after)


def _set_cordon(
    store: ControlStore,
    s: Session,
    nc: NodeCache,
    flag: bool,
    after: lc.PostCommit,
    campaign: int | None = None,
) -> None:
    """Cordon (no new work: the scheduler hears it after the commit) or uncordon a node."""
    row = s.get(Node, nc.id)
    assert row is not None
    row.cordoned = nc.cordoned = flag
    store.dirty(nc.name)
    name, hook = nc.name, store.hook
    if flag:
        why = f"maintenance campaign {campaign}: cordoned" if campaign else "maintenance campaign"
        after.append(lambda: hook.drain(name, why))
    elif nc.state == S.IN_SERVICE.value:
        after.append(lambda: hook.resume(name))


def _fail(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    mn: MaintNode,
    nc: NodeCache | None,
    why: str,
    changes: list[StepChange],
    after: lc.PostCommit,
) -> None:
    """The node goes to repair with the reason; the campaign counts a failure and halts at
    ``max_failures``."""
    reason = f"maintenance campaign {c.id}: {why}"
    if nc is not None and nc.state != S.REPAIR.value:
        if S.REPAIR in lc.ALLOWED[S(nc.state)]:
            _move(store, s, c, nc, S.REPAIR, reason, after)
        elif nc.state == S.IN_SERVICE.value:  # in service -> draining -> repair
            _move(store, s, c, nc, S.DRAINING, reason, after)
            _move(store, s, c, nc, S.REPAIR, reason, after)
    _take(store, s, c, mn, FAILED, why, changes)
    c.failures += 1
    spec = CampaignSpec.model_validate(c.spec)
    if c.state in (RUNNING, PAUSED) and c.failures >= max(1, spec.max_failures):
        c.state = HALTED
        c.reason = f"halted after {c.failures} failure(s) (max {spec.max_failures})"
        s.add(
            EventRow(
                at_s=store.clock(),
                kind="maintenance_halted",
                severity=2,
                message=f"campaign {c.id}: {c.reason}",
                data={"campaign": c.id},
            )
        )


def _give_back(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    mn: MaintNode,
    nc: NodeCache | None,
    why: str,
    changes: list[StepChange],
    after: lc.PostCommit,
) -> None:
    """A node not yet updated leaves the campaign: uncordoned, back in service when the
    campaign drained it."""
    if nc is not None:
        if mn.step in (DRAINING, EVACUATING) and nc.state in (
            S.DRAINING.value,
            S.DRAINED.value,
        ):
            _move(store, s, c, nc, S.IN_SERVICE, f"maintenance campaign {c.id}: {why}", after)
        elif mn.step in (DRAINING, EVACUATING) and nc.state == S.LOST.value:
            # lost in the campaign's drain: when it comes back it is not held out by a
            # campaign that let it go (it comes back through validation, not draining)
            row = s.get(Node, nc.id)
            if row is not None and _drained_by(s, nc.name) == f"campaign:{c.id}":
                row.state_before_lost = None
        if nc.cordoned:
            _set_cordon(store, s, nc, False, after)
    _take(store, s, c, mn, SKIPPED, why, changes)


def _drained_by(s: Session, node: str) -> str | None:
    """Who moved ``node`` into draining last (lost spells aside): a campaign's drain is its
    own to undo, a fault's drain is not."""
    return s.scalar(
        select(Transition.actor)
        .where(
            Transition.node == node,
            Transition.to_state == S.DRAINING.value,
            Transition.from_state != S.LOST.value,
        )
        .order_by(Transition.id.desc())
        .limit(1)
    )


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
    for name in names:
        _one(store, cid, name, changes)
    _start_nodes(store, cid, changes)
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


def _one(store: ControlStore, cid: int, name: str, changes: list[StepChange]) -> None:
    """Advance one node by at most one step, in its own transaction."""
    after: lc.PostCommit = []
    with store.sessions.begin() as s:
        c = s.get(MaintCampaign, cid)
        mn = s.get(MaintNode, (cid, name))
        assert c is not None and mn is not None
        nc = store.nodes.get(name)
        _advance(store, s, c, mn, nc, changes, after)
    store.run_after(after)


def _advance(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    mn: MaintNode,
    nc: NodeCache | None,
    changes: list[StepChange],
    after: lc.PostCommit,
) -> None:
    spec = CampaignSpec.model_validate(c.spec)
    now = store.clock()
    waited = now - mn.step_since_s
    stopping = c.state in (HALTED, ABORTED)
    if mn.step == SELECTED:
        if stopping:
            _take(store, s, c, mn, SKIPPED, f"campaign {c.state}", changes)
        return
    if nc is None:
        _take(store, s, c, mn, FAILED, "node no longer known to the controller", changes)
        return
    state = S(nc.state)
    if mn.step in BEFORE_UPDATE and stopping:
        _give_back(store, s, c, mn, nc, f"campaign {c.state} before its update", changes, after)
        return
    if mn.step == CORDONED:
        if state in (S.IN_SERVICE, S.VALIDATING):
            _move(store, s, c, nc, S.DRAINING, f"maintenance campaign {c.id}: drain", after)
        _take(store, s, c, mn, DRAINING, "draining: jobs finish or are requeued", changes)
        return
    if mn.step == DRAINING:
        if state is S.DRAINED:
            _take(store, s, c, mn, UPDATING, "update ordered", changes, {"key": mn_key(c, mn)})
        elif state in (S.REPAIR, S.FAILED):
            _give_back(
                store, s, c, mn, nc, f"node went {state.value} while draining", changes, after
            )
        elif state is S.LOST:
            # a lost spell may end (a loaded or briefly unreachable agent): the node comes
            # back draining and the drain goes on; one lost past the drain timeout goes back
            if waited > spec.drain_timeout_s:
                why = f"node lost while draining and not back in {spec.drain_timeout_s:g} s"
                _give_back(store, s, c, mn, nc, why, changes, after)
        elif spec.drain_deadline_s is not None and waited > spec.drain_deadline_s:
            why = (
                f"drain deadline ({spec.drain_deadline_s:g} s) passed: jobs get "
                f"{spec.checkpoint_signal} and {spec.checkpoint_grace_s:g} s, then are requeued"
            )
            detail = {"signal": spec.checkpoint_signal, "grace_s": spec.checkpoint_grace_s}
            _take(store, s, c, mn, EVACUATING, why, changes, detail)
            drain_ops.evacuate_after(store, c.id, mn.node, spec, after)
        elif waited > spec.drain_timeout_s:
            _give_back(
                store,
                s,
                c,
                mn,
                nc,
                f"drain did not finish in {spec.drain_timeout_s:g} s",
                changes,
                after,
            )
        return
    if mn.step == EVACUATING:
        _evacuating(store, s, c, mn, nc, spec, waited, changes, after)
        return
    if mn.step == UPDATING:
        out = mn.outcome
        if out is not None:
            if out.get("exit_code") == 0:
                _take(store, s, c, mn, REBOOTING, "update command exited 0", changes)
            else:
                why = (
                    f"update command timed out after {spec.update_timeout_s:g} s"
                    if out.get("timed_out")
                    else f"update command exited {out.get('exit_code')}"
                )
                tail = str(out.get("output_tail") or "").strip().splitlines()[-1:]
                _fail(
                    store,
                    s,
                    c,
                    mn,
                    nc,
                    why + (f": {tail[0][:200]}" if tail else ""),
                    changes,
                    after,
                )
        elif waited > spec.update_timeout_s + spec.back_timeout_s:
            _fail(
                store,
                s,
                c,
                mn,
                nc,
                "no outcome reported for the update (node did not come back)",
                changes,
                after,
            )
        return
    if mn.step == REBOOTING:
        back = (
            state is not S.LOST and nc.last_seen_s is not None and nc.last_seen_s > mn.step_since_s
        )
        if back:
            _take(store, s, c, mn, VERIFYING, "node is back", changes)
        elif waited > spec.back_timeout_s:
            _fail(
                store,
                s,
                c,
                mn,
                nc,
                f"node did not come back within {spec.back_timeout_s:g} s",
                changes,
                after,
            )
        return
    if mn.step == VERIFYING:
        lost = sorted(comp for code, comp in nc.findings if code in LOST_CODES)
        if lost:  # a GPU that fell off the bus reports no versions: its row is stale
            why = f"a GPU fell off the bus after the update ({', '.join(lost[:4])})"
            _fail(store, s, c, mn, nc, why, changes, after)
            return
        diff = deviations(store, nc, spec.baseline)
        if not diff:
            if spec.validate_level == 0:
                _move(
                    store,
                    s,
                    c,
                    nc,
                    S.IN_SERVICE,
                    f"maintenance campaign {c.id}: at baseline",
                    after,
                )
                _take(
                    store,
                    s,
                    c,
                    mn,
                    NODE_DONE,
                    "versions at baseline (no validation asked)",
                    changes,
                )
                return
            if state is S.DRAINED:
                _move(
                    store,
                    s,
                    c,
                    nc,
                    S.VALIDATING,
                    f"maintenance campaign {c.id}: validate after update",
                    after,
                )
            _take(store, s, c, mn, VALIDATING, "versions at baseline; validating", changes)
        elif waited > spec.verify_timeout_s:
            _fail(
                store,
                s,
                c,
                mn,
                nc,
                "versions not at baseline after the update: " + "; ".join(diff[:4]),
                changes,
                after,
            )
        return
    if mn.step == VALIDATING:
        if state is S.IN_SERVICE:
            _take(store, s, c, mn, NODE_DONE, "validated; back in service", changes)
        elif state in (S.REPAIR, S.FAILED):
            _fail(
                store,
                s,
                c,
                mn,
                nc,
                f"validation after the update failed: {nc.state_reason}",
                changes,
                after,
            )
        elif state is S.DRAINED:  # moved to validating at the verify step but was not yet there
            _move(
                store,
                s,
                c,
                nc,
                S.VALIDATING,
                f"maintenance campaign {c.id}: validate after update",
                after,
            )
        elif waited > spec.validate_timeout_s:
            _fail(
                store,
                s,
                c,
                mn,
                nc,
                f"no validation result within {spec.validate_timeout_s:g} s",
                changes,
                after,
            )


def _evacuating(
    store: ControlStore,
    s: Session,
    c: MaintCampaign,
    mn: MaintNode,
    nc: NodeCache,
    spec: CampaignSpec,
    waited: float,
    changes: list[StepChange],
    after: lc.PostCommit,
) -> None:
    """Jobs were signalled and requeued: wait for the node to be drained (idle)."""
    state = S(nc.state)
    if state is S.DRAINED:
        _take(store, s, c, mn, UPDATING, "update ordered", changes, {"key": mn_key(c, mn)})
    elif state in (S.REPAIR, S.FAILED):
        _give_back(store, s, c, mn, nc, f"node went {state.value} while draining", changes, after)
    elif waited > spec.checkpoint_grace_s + EVACUATE_SLACK_S:
        why = (
            f"jobs still on the node {waited:.0f} s after the checkpoint signal "
            f"(grace {spec.checkpoint_grace_s:g} s)"
        )
        _give_back(store, s, c, mn, nc, why, changes, after)
    elif state is not S.LOST and drain_ops.needs_call(store, s, c.id, mn.node):
        drain_ops.evacuate_after(store, c.id, mn.node, spec, after)


def mn_key(c: MaintCampaign, mn: MaintNode) -> str:
    return update_key(c.id, mn.node)


# -- starting nodes ----------------------------------------------------------------------------
def _start_nodes(store: ControlStore, cid: int, changes: list[StepChange]) -> None:
    after: lc.PostCommit = []
    with store.sessions.begin() as s:
        c = s.get(MaintCampaign, cid)
        assert c is not None
        if c.state != RUNNING:
            return
        spec = CampaignSpec.model_validate(c.spec)
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
            _set_cordon(store, s, nc, True, after, c.id)
            _take(store, s, c, mn, CORDONED, "cordoned: no new work", changes)
            flight.append(mn)
    store.run_after(after)


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
