"""What people and agents do to maintenance campaigns (issue 15): start, pause, resume, abort,
read status, and an agent's report of its update. Each write runs on the writer thread in
one transaction with its audit row; call these from a plain thread (FastAPI's thread pool).

The update orders waiting for agents are kept in a per-store map (`orders`) that the writer
replaces after each pass, so the ingest path reads it without touching the database.
"""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.control.campaigns import engine as cp
from gpufleet.control.campaigns.drain import requeue_counts
from gpufleet.control.db.models import AuditEntry, EventRow, MaintCampaign, MaintNode, MaintStep
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import NodeState, TransitionError
from gpufleet.control.state.store import ControlStore, NotFound
from gpufleet.maintenance.planner import CampaignNode, campaign_order
from gpufleet.wire import WireUpdateOrder, WireUpdateReport

S = NodeState
_orders: weakref.WeakKeyDictionary[ControlStore, dict[str, WireUpdateOrder]] = (
    weakref.WeakKeyDictionary()
)


def orders(store: ControlStore) -> dict[str, WireUpdateOrder]:
    """The update order waiting for each node's agent (read from any thread)."""
    return _orders.get(store, {})


def validation_level(store: ControlStore, node: str) -> int | None:
    """The level a campaign asks ``node`` to validate at now (None: the ordinary level 1)."""
    return store.asked_levels.get(node)


def refresh_orders(store: ControlStore) -> None:
    """Rebuild the order and validation-level maps from the database (on the writer, after
    each pass)."""
    out: dict[str, WireUpdateOrder] = {}
    levels: dict[str, int] = {}
    with store.sessions() as s:
        q2 = (
            select(MaintNode.node, MaintCampaign.spec)
            .join(MaintCampaign, MaintCampaign.id == MaintNode.campaign_id)
            .where(MaintNode.step == cp.VALIDATING)
        )
        for node, spec_doc in s.execute(q2):
            level = int((spec_doc or {}).get("validate_level", 1))
            if level >= 2:
                levels[node] = level
        q = (
            select(MaintNode, MaintCampaign)
            .join(MaintCampaign, MaintCampaign.id == MaintNode.campaign_id)
            .where(MaintNode.step == cp.UPDATING, MaintNode.outcome.is_(None))
        )
        for mn, c in s.execute(q):
            spec = cp.CampaignSpec.model_validate(c.spec)
            out[mn.node] = WireUpdateOrder(
                key=cp.update_key(c.id, mn.node),
                command=spec.update_command,
                timeout_s=spec.update_timeout_s,
            )
    _orders[store] = out
    store.asked_levels = levels


def run_pass(store: ControlStore) -> list[cp.StepChange]:
    """One engine pass and a fresh order map (a writer command; the controller's tick)."""
    changes = cp.tick(store)
    refresh_orders(store)
    return changes


def tick(store: ControlStore) -> list[cp.StepChange]:
    """`run_pass` on the writer (from the controller's loop thread)."""
    return store.writer.call(lambda: run_pass(store))


# -- start ---------------------------------------------------------------------------------------
def start(store: ControlStore, spec: cp.CampaignSpec, who: Principal) -> int:
    return store.writer.call(lambda: _start(store, spec, who))


def _select_ok(spec: cp.CampaignSpec, name: str, model: str | None, rack: str | None) -> bool:
    attrs = {"node": name, "model": model, "rack": rack}
    return all(fnmatch.fnmatchcase(attrs.get(k) or "", g) for k, g in spec.select)


def live_campaign(s: Session) -> int | None:
    """The campaign running or paused now (one at a time)."""
    q = select(MaintCampaign.id).where(MaintCampaign.state.in_((cp.RUNNING, cp.PAUSED)))
    return s.scalars(q).first()


def _members(
    store: ControlStore, spec: cp.CampaignSpec
) -> tuple[list[CampaignNode], list[dict[str, str]]]:
    """The nodes out of baseline a campaign takes (in order), and those skipped with why."""
    members: list[CampaignNode] = []
    skipped: list[dict[str, str]] = []
    for nc in store.nodes.values():
        if not _select_ok(spec, nc.name, nc.model, nc.rack):
            continue
        if nc.model is None:  # in service on its validation report before its first batch
            skipped.append({"node": nc.name, "reason": "its GPUs are not reported yet"})
            continue
        if nc.model not in spec.baseline.models:
            continue
        if not cp.deviations(store, nc, spec.baseline):
            continue
        if nc.state not in (S.IN_SERVICE.value, S.DRAINED.value):
            skipped.append({"node": nc.name, "reason": f"node is {nc.state}"})
            continue
        members.append(
            CampaignNode(
                nc.name, len(nc.gpus), nc.rack or nc.name, in_service=nc.state == S.IN_SERVICE.value
            )
        )
    return campaign_order(members), skipped


def _start(
    store: ControlStore,
    spec: cp.CampaignSpec,
    who: Principal | None,
    *,
    state: str = cp.RUNNING,
    created_by: str | None = None,
) -> int:
    """A new campaign (running; ``proposed`` by the policy, then ``who`` is None)."""
    now = store.clock()
    with store.sessions.begin() as s:
        live = live_campaign(s)
        if live is not None and state == cp.RUNNING:
            raise TransitionError(
                f"campaign {live} is still running or paused",
                hint="abort it or wait until it ends",
            )
        members, skipped = _members(store, spec)
        c = MaintCampaign(
            state=state,
            spec=spec.model_dump(mode="json"),
            created_s=now,
            created_by=created_by or (who.actor if who else "policy:maintenance"),
            updated_s=now,
            failures=0,
            reason="proposed by the maintenance policy" if state == cp.PROPOSED else "",
        )
        s.add(c)
        s.flush()
        sample = {"capacity": list(cp.capacity(store, s)[:2])}
        for i, m in enumerate(members):
            s.add(
                MaintNode(
                    campaign_id=c.id,
                    node=m.name,
                    ord=i + 1,
                    domain=m.domain,
                    gpus=m.gpus,
                    step=cp.SELECTED,
                    step_since_s=now,
                    reason="out of baseline",
                )
            )
            s.add(
                MaintStep(campaign_id=c.id, node=m.name, step=cp.SELECTED, at_s=now, detail=sample)
            )
        if not members:
            c.state, c.reason = cp.DONE, "no node out of baseline"
            if skipped:
                first = skipped[0]
                c.reason += f"; {len(skipped)} skipped ({first['node']}: {first['reason']})"
        detail = {"nodes": len(members), "skipped": skipped}
        if who is not None:
            store.audit(s, who, "maintenance.start", f"campaign:{c.id}", detail=detail)
        else:
            s.add(
                AuditEntry(
                    at_s=now,
                    actor="policy:maintenance",
                    role="operator",
                    action="maintenance.propose",
                    target=f"campaign:{c.id}",
                    outcome="ok",
                    detail=detail,
                )
            )
            s.add(
                EventRow(
                    at_s=now,
                    kind="maintenance_proposed",
                    message=f"campaign {c.id} proposed: {len(members)} node(s) out of baseline",
                    data={"campaign": c.id, "nodes": len(members)},
                )
            )
        return c.id


# -- pause / resume / abort ----------------------------------------------------------------------
CONTROL = {
    "start": ((cp.PROPOSED,), cp.RUNNING),
    "pause": ((cp.RUNNING,), cp.PAUSED),
    "resume": ((cp.PAUSED,), cp.RUNNING),
    "abort": ((cp.RUNNING, cp.PAUSED, cp.HALTED, cp.PROPOSED), cp.ABORTED),
}


def control(store: ControlStore, cid: int, action: str, who: Principal) -> None:
    store.writer.call(lambda: _control(store, cid, action, who))


def _control(store: ControlStore, cid: int, action: str, who: Principal) -> None:
    sources, target = CONTROL[action]
    with store.sessions.begin() as s:
        c = s.get(MaintCampaign, cid)
        if c is None:
            raise NotFound(f"campaign {cid} not found")
        if c.state not in sources:
            raise TransitionError(f"campaign {cid} is {c.state}: cannot {action}")
        if action == "start":
            live = live_campaign(s)
            if live is not None:
                raise TransitionError(
                    f"campaign {live} is still running or paused",
                    hint="abort it or wait until it ends",
                )
            _drop_compliant(store, s, c)
        c.state, c.updated_s = target, store.clock()
        c.reason = f"{action} by {who.actor}"
        store.audit(s, who, f"maintenance.{action}", f"campaign:{cid}")
    store.bump()


def _drop_compliant(store: ControlStore, s: Session, c: MaintCampaign) -> None:
    """A proposal being started: nodes that reached the baseline since are skipped."""
    spec = cp.CampaignSpec.model_validate(c.spec)
    now = store.clock()
    for mn in s.scalars(select(MaintNode).where(MaintNode.campaign_id == c.id)):
        nc = store.nodes.get(mn.node)
        if nc is not None and not cp.deviations(store, nc, spec.baseline):
            mn.step, mn.step_since_s, mn.reason = cp.SKIPPED, now, "at baseline when started"
            s.add(MaintStep(campaign_id=c.id, node=mn.node, step=cp.SKIPPED, at_s=now, detail={}))


# -- an agent's report ---------------------------------------------------------------------------
def report(store: ControlStore, rep: WireUpdateReport, who: Principal) -> bool:
    """Record an update's outcome; True when it was the one awaited (a repeat is ignored)."""
    if who.role is Role.AGENT:
        if not who.may_push_for(rep.node):
            raise PermissionError(f"this agent token is bound to another node than {rep.node!r}")
    elif not who.at_least(Role.ADMIN):
        raise PermissionError("update reports come from the node's agent (or an admin)")
    return store.writer.call(lambda: _report(store, rep, who))


def _report(store: ControlStore, rep: WireUpdateReport, who: Principal) -> bool:
    with store.sessions.begin() as s:
        q = select(MaintNode).where(MaintNode.node == rep.node, MaintNode.step == cp.UPDATING)
        for mn in s.scalars(q):
            if cp.update_key(mn.campaign_id, mn.node) != rep.key or mn.outcome is not None:
                continue
            mn.outcome = {**rep.model_dump(mode="json"), "received_s": store.clock()}
            store.audit(
                s,
                who,
                "maintenance.report",
                rep.node,
                outcome="ok" if rep.exit_code == 0 else "failed",
                detail={"key": rep.key, "exit_code": rep.exit_code, "timed_out": rep.timed_out},
            )
            _orders.get(store, {}).pop(rep.node, None)
            return True
    return False


# -- status --------------------------------------------------------------------------------------
def status(store: ControlStore, cid: int | None = None) -> dict[str, Any]:
    """One campaign (the newest when ``cid`` is None) with its nodes and capacity now."""
    with store.sessions() as s:
        q = select(MaintCampaign).order_by(MaintCampaign.id.desc())
        c = s.get(MaintCampaign, cid) if cid is not None else s.scalars(q).first()
        if c is None:
            raise NotFound("no such campaign" if cid is not None else "no campaign yet")
        nodes = list(
            s.scalars(
                select(MaintNode).where(MaintNode.campaign_id == c.id).order_by(MaintNode.ord)
            )
        )
        in_gpus, total_gpus, out_nodes, total_nodes = cp.capacity(store, s)
        history = capacity_history(s, c.id)
        requeued = requeue_counts(s, c.id)
    if c.state in cp.LIVE_CAMPAIGN or not history:  # a campaign that ended keeps its last
        history.append({"t": store.clock(), "in_service_gpus": in_gpus, "fleet_gpus": total_gpus})
    spec = cp.CampaignSpec.model_validate(c.spec)
    by_step: dict[str, int] = {}
    for mn in nodes:
        by_step[mn.step] = by_step.get(mn.step, 0) + 1
    return {
        "id": c.id,
        "state": c.state,
        "reason": c.reason,
        "created_s": c.created_s,
        "created_by": c.created_by,
        "failures": c.failures,
        "max_failures": spec.max_failures,
        "batch": spec.batch,
        "floor": spec.floor,
        "windows": spec.windows or ["always"],
        "by_step": by_step,
        # jobs the drain deadline requeued after the checkpoint signal / killed without it
        "requeued": requeued,
        "capacity": {
            "in_service_gpus": in_gpus,
            "fleet_gpus": total_gpus,
            "in_service_fraction": in_gpus / total_gpus if total_gpus else None,
            "nodes_out": out_nodes,
            "fleet_nodes": total_nodes,
            "history": history,
        },
        "nodes": [
            {
                "node": mn.node,
                "order": mn.ord,
                "domain": mn.domain,
                "step": mn.step,
                "since_s": mn.step_since_s,
                "reason": mn.reason,
                "exit_code": (mn.outcome or {}).get("exit_code"),
            }
            for mn in nodes
        ],
    }


def capacity_history(s: Session, cid: int) -> list[dict[str, Any]]:
    """In-service and fleet GPUs as sampled at each of the campaign's steps (each
    ``maint_steps`` row carries the capacity of the moment it was taken), in time order."""
    out: list[dict[str, Any]] = []
    q = select(MaintStep.at_s, MaintStep.detail).where(MaintStep.campaign_id == cid)
    for at_s, detail in s.execute(q.order_by(MaintStep.at_s, MaintStep.id)):
        cap = (detail or {}).get("capacity")
        if not cap:
            continue
        point = {"t": at_s, "in_service_gpus": cap[0], "fleet_gpus": cap[1]}
        if out and out[-1]["t"] == at_s:
            out[-1] = point  # steps of one instant: the last one stands
        else:
            out.append(point)
    return out


def campaigns(
    store: ControlStore, limit: int = 50, visible: Callable[[str], bool] | None = None
) -> list[dict[str, Any]]:
    """The newest campaigns, each with its node count per step (over the nodes ``visible``
    accepts, when given: a tenant token's view)."""
    with store.sessions() as s:
        rows = list(s.scalars(select(MaintCampaign).order_by(MaintCampaign.id.desc()).limit(limit)))
        counts: dict[int, dict[str, int]] = {c.id: {} for c in rows}
        q = select(MaintNode.campaign_id, MaintNode.step, MaintNode.node).where(
            MaintNode.campaign_id.in_(list(counts))
        )
        for cid, step, node in s.execute(q):
            if visible is None or visible(node):
                counts[cid][step] = counts[cid].get(step, 0) + 1
    return [
        {
            "id": c.id,
            "state": c.state,
            "reason": c.reason,
            "created_s": c.created_s,
            "created_by": c.created_by,
            "updated_s": c.updated_s,
            "failures": c.failures,
            "nodes": sum(counts[c.id].values()),
            "by_step": counts[c.id],
        }
        for c in rows
    ]
