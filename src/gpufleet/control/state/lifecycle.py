"""Node lifecycle: states, the transitions allowed between them, operator actions, and the
calls through which drains, resumes and losses reach the scheduler after the commit (the
kernel's `gpufleet.control.state.ports.SchedulerHook`).

::

    registering -> validating -> in_service -> draining -> drained -> repair -> validating
                                      ^-------- resume ---------'
    any live state -> lost (heartbeats stop)      any state -> failed (operator)

Every transition is one `Transition` row (who, why, when) and one event.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from gpufleet.control.db.models import EventRow, Node, Transition
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.control.state.ports import SchedulerHook


class NodeState(StrEnum):
    """Lifecycle states of a node."""

    REGISTERING = "registering"
    VALIDATING = "validating"
    IN_SERVICE = "in_service"
    DRAINING = "draining"
    DRAINED = "drained"
    REPAIR = "repair"
    LOST = "lost"
    FAILED = "failed"


S = NodeState
# States counted as "out of the fleet" by the circuit breaker.
OUT_STATES = frozenset({S.DRAINING, S.DRAINED, S.REPAIR, S.LOST, S.FAILED})
# States from which missing heartbeats make a node lost (repair and failed nodes may be off).
LOSABLE = frozenset({S.REGISTERING, S.VALIDATING, S.IN_SERVICE, S.DRAINING, S.DRAINED})

ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    S.REGISTERING: frozenset({S.VALIDATING, S.LOST, S.FAILED}),
    S.VALIDATING: frozenset({S.IN_SERVICE, S.REPAIR, S.DRAINING, S.LOST, S.FAILED}),
    S.IN_SERVICE: frozenset({S.DRAINING, S.LOST, S.FAILED}),
    S.DRAINING: frozenset({S.DRAINED, S.IN_SERVICE, S.REPAIR, S.LOST, S.FAILED}),
    # drained -> validating: a maintenance campaign's node after its update (issue 15)
    S.DRAINED: frozenset({S.IN_SERVICE, S.VALIDATING, S.REPAIR, S.LOST, S.FAILED}),
    S.REPAIR: frozenset({S.VALIDATING, S.FAILED}),
    S.LOST: frozenset({S.VALIDATING, S.DRAINING, S.DRAINED, S.REPAIR, S.FAILED}),
    S.FAILED: frozenset({S.REPAIR}),
}


class TransitionError(UsageError):
    """A transition the state machine does not allow (the API answers 409)."""


class Action(StrEnum):
    """Operator actions on a node (``POST /api/v1/nodes/{name}/actions/{action}``)."""

    CORDON = "cordon"  # no new work; state unchanged
    UNCORDON = "uncordon"
    DRAIN = "drain"  # cordon and let running work finish: draining -> drained
    RESUME = "resume"  # back to in_service from draining/drained
    REPAIR = "repair"  # send to repair
    VALIDATE = "validate"  # repair/drained/lost -> validating (a validation result decides)
    FAIL = "fail"  # mark failed (dead hardware)
    ACKNOWLEDGE = "acknowledge"  # acknowledge every active finding of the node


ACTION_TARGET: dict[Action, NodeState] = {
    Action.DRAIN: S.DRAINING,
    Action.RESUME: S.IN_SERVICE,
    Action.REPAIR: S.REPAIR,
    Action.VALIDATE: S.VALIDATING,
    Action.FAIL: S.FAILED,
}


PostCommit = list[Callable[[], None]]


def transition(
    session: Session,
    node: Node,
    to: NodeState,
    *,
    actor: str,
    reason: str,
    now_s: float,
    hook: SchedulerHook,
    after: PostCommit,
) -> Transition:
    """Move ``node`` to ``to`` (checked against ALLOWED), record it, queue the hook call."""
    current = NodeState(node.state)
    if to not in ALLOWED[current]:
        raise TransitionError(
            f"node {node.name}: {current.value} -> {to.value} is not allowed",
            hint=f"from {current.value}: {', '.join(sorted(s.value for s in ALLOWED[current]))}",
        )
    return _record(session, node, current, to, actor, reason, now_s, hook, after)


def register(session: Session, node: Node, *, actor: str, reason: str, now_s: float) -> Transition:
    """The first transition of a new node (into ``registering``)."""
    node.state = S.REGISTERING.value
    node.state_since_s = now_s
    node.state_reason = reason
    row = Transition(
        node=node.name,
        from_state=None,
        to_state=S.REGISTERING.value,
        actor=actor,
        reason=reason,
        at_s=now_s,
    )
    session.add(row)
    session.add(EventRow(at_s=now_s, node=node.name, kind="node_registered", message=reason))
    return row


def _record(
    session: Session,
    node: Node,
    current: NodeState,
    to: NodeState,
    actor: str,
    reason: str,
    now_s: float,
    hook: SchedulerHook,
    after: PostCommit,
) -> Transition:
    if to is S.LOST:
        node.state_before_lost = current.value
    node.state = to.value
    node.state_since_s = now_s
    node.state_reason = reason
    row = Transition(
        node=node.name,
        from_state=current.value,
        to_state=to.value,
        actor=actor,
        reason=reason,
        at_s=now_s,
    )
    session.add(row)
    severity = 2 if to in (S.LOST, S.FAILED) else 1 if to in OUT_STATES else 0
    session.add(
        EventRow(
            at_s=now_s,
            node=node.name,
            kind="transition",
            severity=severity,
            message=f"{current.value} -> {to.value}: {reason}",
            data={"from": current.value, "to": to.value, "actor": actor},
        )
    )
    name = node.name
    if to is S.DRAINING:
        after.append(lambda: hook.drain(name, reason))
    elif to is S.IN_SERVICE:
        after.append(lambda: hook.resume(name))
    elif to is S.LOST:
        after.append(lambda: hook.lost(name))
    elif to in (S.REPAIR, S.FAILED) and current not in OUT_STATES:
        after.append(lambda: hook.drain(name, reason))
    return row
