"""The campaign engine's step handlers, as one table (`RULES`): for each step a node can be in,
the handler that looks at the node (its lifecycle state, how long it has waited, the update's
outcome, its versions) and the steps it may take from there. A handler works on one
`NodePass`: the node's turn in a pass, inside its own unit of work, with the campaign's spec
parsed once per pass (`gpufleet.control.campaigns.engine` runs the passes).

A step taken outside its rule's ``leads_to`` is a bug, refused before anything is written
(`NodePass.take` raises), so the table is the engine's whole state machine on one screen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.control.campaigns import drain as drain_ops
from gpufleet.control.campaigns.spec import (
    ABORTED,
    BEFORE_UPDATE,
    EVACUATE_SLACK_S,
    HALTED,
    LOST_CODES,
    PAUSED,
    RUNNING,
    CampaignSpec,
    NodeStep,
    StepChange,
    deviations,
    reported_since,
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
from gpufleet.control.state.lifecycle import NodeState
from gpufleet.control.state.store import restart_grace_extra_s

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore, NodeCache
    from gpufleet.control.state.uow import UnitOfWork

S = NodeState
P = NodeStep


@dataclass
class NodePass:
    """One node's turn in a pass: its campaign and rows, its cache entry (None: the controller
    no longer knows it), the campaign's spec, and the unit of work it is written in."""

    uow: UnitOfWork
    c: MaintCampaign
    mn: MaintNode
    nc: NodeCache | None
    spec: CampaignSpec
    changes: list[StepChange]
    now: float
    leads_to: frozenset[NodeStep] = field(default_factory=frozenset)

    @property
    def store(self) -> ControlStore:
        return self.uow.store

    @property
    def s(self) -> Session:
        return self.uow.s

    @property
    def waited(self) -> float:
        """How long the node has been in its step."""
        return self.now - self.mn.step_since_s

    @property
    def stopping(self) -> bool:
        return self.c.state in (HALTED, ABORTED)

    def overdue(self, timeout_s: float) -> bool:
        """The node waited past ``timeout_s`` for what its agent reports, and this controller
        has listened for it long enough to say so: not while its API does not listen yet, nor
        within the grace a (re)started or stalled controller gives every node before calling
        it lost (`restart_grace_extra_s`): what the agent sent meanwhile is still on its way
        (a controller killed and started again judged its first pass before hearing anyone)."""
        store = self.store
        if self.waited <= timeout_s or store.awaiting_api:
            return False
        interval = self.nc.interval_s if self.nc is not None else 0.0
        grace = store.lost_after_intervals * interval + restart_grace_extra_s(interval)
        return self.now - store.grace_from_s >= grace

    def why(self, text: str) -> str:
        """A lifecycle reason naming the campaign."""
        return f"maintenance campaign {self.c.id}: {text}"

    def take(self, step: NodeStep, reason: str, detail: dict[str, Any] | None = None) -> None:
        """Record the node entering ``step``: node row, step row (unique key), audit, event."""
        if step not in self.leads_to:
            raise ValueError(f"campaign step {self.mn.step} -> {step} is not in the table")
        take_step(self.uow, self.c, self.mn, step, reason, self.changes, detail)

    def move(self, to: NodeState, reason: str) -> None:
        """The node's lifecycle to ``to`` (nothing when it is there already)."""
        if self.nc is not None and self.nc.state != to.value:
            self.uow.move(self.nc, to, actor=f"campaign:{self.c.id}", reason=reason)

    def fail(self, why: str) -> None:
        """The node goes to repair with the reason; the campaign counts a failure and halts at
        ``max_failures``."""
        nc, c = self.nc, self.c
        reason = self.why(why)
        if nc is not None and nc.state != S.REPAIR.value:
            if S.REPAIR in lc.ALLOWED[S(nc.state)]:
                self.move(S.REPAIR, reason)
            elif nc.state == S.IN_SERVICE.value:  # in service -> draining -> repair
                self.move(S.DRAINING, reason)
                self.move(S.REPAIR, reason)
        self.take(P.FAILED, why)
        c.failures += 1
        if c.state in (RUNNING, PAUSED) and c.failures >= max(1, self.spec.max_failures):
            c.state = HALTED
            c.reason = f"halted after {c.failures} failure(s) (max {self.spec.max_failures})"
            self.s.add(
                EventRow(
                    at_s=self.store.clock(),
                    kind="maintenance_halted",
                    severity=2,
                    message=f"campaign {c.id}: {c.reason}",
                    data={"campaign": c.id},
                )
            )

    def give_back(self, why: str) -> None:
        """A node not yet updated leaves the campaign: uncordoned, back in service when the
        campaign drained it."""
        nc, mn = self.nc, self.mn
        if nc is not None:
            draining = mn.step in (P.DRAINING, P.EVACUATING)
            if draining and nc.state in (S.DRAINING.value, S.DRAINED.value):
                self.move(S.IN_SERVICE, self.why(why))
            elif draining and nc.state == S.LOST.value:
                # lost in the campaign's drain: when it comes back it is not held out by a
                # campaign that let it go (it comes back through validation, not draining)
                row = self.s.get(Node, nc.id)
                if row is not None and _drained_by(self.s, nc.name) == f"campaign:{self.c.id}":
                    row.state_before_lost = None
            if nc.cordoned:
                set_cordon(self.uow, nc, False)
        self.take(P.SKIPPED, why)

    def order_update(self) -> None:
        self.take(P.UPDATING, "update ordered", {"key": update_key(self.c.id, self.mn.node)})


def take_step(
    uow: UnitOfWork,
    c: MaintCampaign,
    mn: MaintNode,
    step: NodeStep,
    reason: str,
    changes: list[StepChange],
    detail: dict[str, Any] | None = None,
) -> None:
    """Record ``mn`` entering ``step``: node row, step row (unique key), audit row, event."""
    now = uow.store.clock()
    mn.step, mn.step_since_s, mn.reason = step, now, reason
    c.updated_s = now
    data = {"campaign": c.id, "step": step.value, **(detail or {})}
    failed = step is P.FAILED
    uow.s.add(MaintStep(campaign_id=c.id, node=mn.node, step=step.value, at_s=now, detail=data))
    uow.s.add(
        AuditEntry(
            at_s=now,
            actor=f"campaign:{c.id}",
            role="operator",
            action=f"maintenance.{step.value}",
            target=mn.node,
            outcome="failed" if failed else "ok",
            detail={"reason": reason, **data},
        )
    )
    uow.s.add(
        EventRow(
            at_s=now,
            node=mn.node,
            kind="maintenance_step",
            severity=2 if failed else 0,
            message=f"campaign {c.id}: {step.value}: {reason}",
            data=data,
        )
    )
    changes.append(StepChange(c.id, mn.node, step.value, reason))


def set_cordon(uow: UnitOfWork, nc: NodeCache, flag: bool, campaign: int | None = None) -> None:
    """Cordon (no new work: the scheduler hears it after the commit) or uncordon a node."""
    row = uow.s.get(Node, nc.id)
    assert row is not None
    row.cordoned = nc.cordoned = flag
    uow.store.dirty(nc.name)
    name, hook = nc.name, uow.store.hook
    if flag:
        why = f"maintenance campaign {campaign}: cordoned" if campaign else "maintenance campaign"
        uow.later(lambda: hook.drain(name, why))
    elif nc.state == S.IN_SERVICE.value:
        uow.later(lambda: hook.resume(name))


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


# -- the handlers: one per step, on a node the controller knows ----------------------------------
Handler = Callable[[NodePass, "NodeCache", NodeState], None]


def _cordoned(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    if state in (S.IN_SERVICE, S.VALIDATING):
        p.move(S.DRAINING, p.why("drain"))
    p.take(P.DRAINING, "draining: jobs finish or are requeued")


def _draining(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    spec = p.spec
    if state is S.DRAINED:
        p.order_update()
    elif state in (S.REPAIR, S.FAILED):
        p.give_back(f"node went {state.value} while draining")
    elif state is S.LOST:
        # a lost spell may end (a loaded or briefly unreachable agent): the node comes back
        # draining and the drain goes on; one lost past the drain timeout goes back
        if p.waited > spec.drain_timeout_s:
            p.give_back(f"node lost while draining and not back in {spec.drain_timeout_s:g} s")
    elif spec.drain_deadline_s is not None and p.waited > spec.drain_deadline_s:
        why = (
            f"drain deadline ({spec.drain_deadline_s:g} s) passed: jobs get "
            f"{spec.checkpoint_signal} and {spec.checkpoint_grace_s:g} s, then are requeued"
        )
        detail = {"signal": spec.checkpoint_signal, "grace_s": spec.checkpoint_grace_s}
        p.take(P.EVACUATING, why, detail)
        drain_ops.evacuate_after(p.store, p.c.id, p.mn.node, spec, p.uow.after)
    elif p.waited > spec.drain_timeout_s:
        p.give_back(f"drain did not finish in {spec.drain_timeout_s:g} s")


def _evacuating(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    """Jobs were signalled and requeued: wait for the node to be drained (idle)."""
    grace = p.spec.checkpoint_grace_s
    if state is S.DRAINED:
        p.order_update()
    elif state in (S.REPAIR, S.FAILED):
        p.give_back(f"node went {state.value} while draining")
    elif p.waited > grace + EVACUATE_SLACK_S:
        p.give_back(
            f"jobs still on the node {p.waited:.0f} s after the checkpoint signal "
            f"(grace {grace:g} s)"
        )
    elif state is not S.LOST and drain_ops.needs_call(p.store, p.s, p.c.id, p.mn.node):
        drain_ops.evacuate_after(p.store, p.c.id, p.mn.node, p.spec, p.uow.after)


def _updating(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    out, spec = p.mn.outcome, p.spec
    if out is not None:
        if out.get("exit_code") == 0:
            p.take(P.REBOOTING, "update command exited 0")
            return
        why = (
            f"update command timed out after {spec.update_timeout_s:g} s"
            if out.get("timed_out")
            else f"update command exited {out.get('exit_code')}"
        )
        tail = str(out.get("output_tail") or "").strip().splitlines()[-1:]
        p.fail(why + (f": {tail[0][:200]}" if tail else ""))
    elif p.overdue(spec.update_timeout_s + spec.back_timeout_s):
        p.fail("no outcome reported for the update (node did not come back)")


def _rebooting(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    # back: its agent described its GPUs after the controller had the update's outcome (the
    # agent restarts once it has reported it). A heartbeat is not enough: the old agent's
    # batches (spooled before the update, replayed by the restarted agent ahead of its own),
    # or a restarted agent's before it read the devices, hold the versions of before the
    # update, which verifying would judge as the versions after it.
    spec = p.spec
    since = float((p.mn.outcome or {}).get("received_s") or p.mn.step_since_s)
    heard = nc.last_seen_s is not None and nc.last_seen_s > since
    lost_gpu = any(code in LOST_CODES for code, _comp in nc.findings)
    if state is not S.LOST and (reported_since(p.s, nc.id, since) or (heard and lost_gpu)):
        p.take(P.VERIFYING, "node is back: its GPUs described after the update")
    elif not heard and p.overdue(spec.back_timeout_s):
        p.fail(f"node did not come back within {spec.back_timeout_s:g} s")
    elif p.overdue(spec.back_timeout_s + spec.verify_timeout_s):  # heard, GPUs not described
        p.fail(
            f"no description of the GPUs (their versions) since the update, "
            f"{spec.back_timeout_s + spec.verify_timeout_s:g} s"
        )


def _verifying(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    lost = sorted(comp for code, comp in nc.findings if code in LOST_CODES)
    if lost:  # a GPU that fell off the bus reports no versions: its row is stale
        p.fail(f"a GPU fell off the bus after the update ({', '.join(lost[:4])})")
        return
    diff = deviations(p.store, nc, p.spec.baseline)
    if diff:
        if p.overdue(p.spec.verify_timeout_s):
            p.fail("versions not at baseline after the update: " + "; ".join(diff[:4]))
    elif p.spec.validate_level == 0:
        p.move(S.IN_SERVICE, p.why("at baseline"))
        p.take(P.DONE, "versions at baseline (no validation asked)")
    else:
        if state is S.DRAINED:
            p.move(S.VALIDATING, p.why("validate after update"))
        p.take(P.VALIDATING, "versions at baseline; validating")


def _validating(p: NodePass, nc: NodeCache, state: NodeState) -> None:
    if state is S.IN_SERVICE:
        p.take(P.DONE, "validated; back in service")
    elif state in (S.REPAIR, S.FAILED):
        p.fail(f"validation after the update failed: {nc.state_reason}")
    elif state is S.DRAINED:  # moved to validating at the verify step but was not yet there
        p.move(S.VALIDATING, p.why("validate after update"))
    elif p.overdue(p.spec.validate_timeout_s):
        p.fail(f"no validation result within {p.spec.validate_timeout_s:g} s")


@dataclass(frozen=True)
class StepRule:
    """What a node in ``step`` may become, and the handler that decides."""

    step: NodeStep
    leads_to: frozenset[NodeStep]
    run: Handler


def _rule(step: NodeStep, run: Handler, *to: NodeStep) -> StepRule:
    return StepRule(step, frozenset(to), run)


#: the engine's state machine: step -> (where it may lead, who decides). A selected node is
#: started by the pass's capacity check (-> cordoned) or skipped when its campaign stops; any
#: step may fail when the controller forgets the node; a step before the update is given back
#: (skipped) when its campaign stops.
RULES: dict[NodeStep, StepRule] = {
    r.step: r
    for r in (
        _rule(P.CORDONED, _cordoned, P.DRAINING),
        _rule(P.DRAINING, _draining, P.UPDATING, P.EVACUATING, P.SKIPPED),
        _rule(P.EVACUATING, _evacuating, P.UPDATING, P.SKIPPED),
        _rule(P.UPDATING, _updating, P.REBOOTING, P.FAILED),
        _rule(P.REBOOTING, _rebooting, P.VERIFYING, P.FAILED),
        _rule(P.VERIFYING, _verifying, P.VALIDATING, P.DONE, P.FAILED),
        _rule(P.VALIDATING, _validating, P.DONE, P.FAILED),
    )
}


def advance(p: NodePass) -> None:
    """Advance one node by at most one step."""
    step = P(p.mn.step)
    if step is P.SELECTED:
        if p.stopping:
            p.leads_to = frozenset({P.SKIPPED})
            p.take(P.SKIPPED, f"campaign {p.c.state}")
        return
    if p.nc is None:
        p.leads_to = frozenset({P.FAILED})
        p.take(P.FAILED, "node no longer known to the controller")
        return
    if step in BEFORE_UPDATE and p.stopping:
        p.leads_to = frozenset({P.SKIPPED})
        p.give_back(f"campaign {p.c.state} before its update")
        return
    rule = RULES[step]
    p.leads_to = rule.leads_to
    rule.run(p, p.nc, S(p.nc.state))
