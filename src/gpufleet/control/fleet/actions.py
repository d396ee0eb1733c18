"""Writes that people make: lifecycle actions, acknowledgements, validation results, node
attributes, policy and tokens. Each runs on the writer thread (`gpufleet.control.state.writer`) in
one transaction with its audit row; the public functions hand it over and wait for the result, so
call them from a plain thread (FastAPI runs sync handlers on its thread pool), never from the event
loop."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from gpufleet.control.db.models import (
    ControllerState,
    EventRow,
    FindingRow,
    Node,
    Rack,
    ValidationResultRow,
)
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.cache import agent_ack
from gpufleet.control.state.lifecycle import ACTION_TARGET, Action, NodeState
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.control.state.store import ControlStore, NodeCache, NodeView, NotFound
from gpufleet.errors import UsageError

S = NodeState
VERDICTS = ("pass", "warn", "fail")


def _node(store: ControlStore, name: str) -> NodeCache:
    """The writer's cache entry of a node about to change (its snapshot is copied again)."""
    nc = store.nodes.get(name)
    if nc is None:
        raise NotFound(f"node {name!r} not found")
    store.dirty(name)
    return nc


def _view(store: ControlStore, name: str) -> NodeView:
    """The node as published after the write (the writer publishes before answering)."""
    view = store.view.nodes.get(name)
    if view is None:
        raise NotFound(f"node {name!r} not found")
    return view


def node_action(
    store: ControlStore, name: str, action: Action, who: Principal, reason: str = ""
) -> NodeView:
    """Apply one operator action to a node (raises TransitionError when not allowed)."""
    store.writer.call(lambda: _node_action(store, name, action, who, reason))
    return _view(store, name)


def _node_action(
    store: ControlStore, name: str, action: Action, who: Principal, reason: str
) -> None:
    given = reason.strip()
    reason = given or f"{action.value} by {who.actor}"
    nc = _node(store, name)
    with store.unit_of_work() as uow:
        s = uow.s
        if action in (Action.CORDON, Action.UNCORDON):
            flag = action is Action.CORDON
            s.execute(update(Node).where(Node.id == nc.id).values(cordoned=flag))
            nc.cordoned = flag
            s.add(
                EventRow(
                    at_s=store.clock(),
                    node=name,
                    kind=action.value,
                    message=reason,
                    data={"actor": who.actor},
                )
            )
            if flag:
                uow.later(lambda: store.hook.drain(name, reason))
            elif nc.state == S.IN_SERVICE:
                uow.later(lambda: store.hook.resume(name))
        elif action is Action.ACKNOWLEDGE:
            for fc in list(nc.findings.values()):
                _ack(store, s, nc, fc.id, who, given)
        else:
            uow.move(nc, ACTION_TARGET[action], actor=who.actor, reason=reason)
            if action is Action.VALIDATE:
                uow.maybe_in_service(nc, who.actor)
        uow.audit(who, f"node.{action.value}", name, detail={"reason": reason})


def _ack(
    store: ControlStore, s: Any, nc: NodeCache, finding_id: int, who: Principal, why: str = ""
) -> None:
    """Acknowledge one finding. One the agent no longer reports clears now; a sticky one it
    still reports stays active, and every ``Ack`` to the node's agent carries the
    acknowledgement (``FindingCache.ack``) until the agent's snapshot drops it."""
    now = store.clock()
    key = next((k for k, f in nc.findings.items() if f.id == finding_id), None)
    values: dict[str, Any] = {"acknowledged_by": who.actor, "acknowledged_s": now}
    if key is not None:
        fc = nc.findings[key]
        fc.acknowledged = True
        if not fc.present:
            values.update(active=False, cleared_s=now)
            del nc.findings[key]
        else:  # the newest acknowledgement, like the row's acknowledged_by
            fc.ack = agent_ack(key[0], key[1], fc.sticky, who.actor, now, why)
    s.execute(update(FindingRow).where(FindingRow.id == finding_id).values(**values))
    s.add(
        EventRow(
            at_s=now,
            node=nc.name,
            kind="finding_acknowledged",
            message=f"finding {finding_id} acknowledged by {who.actor}",
            data={"finding_id": finding_id, **({"why": why} if why else {})},
        )
    )


def acknowledge_finding(store: ControlStore, finding_id: int, who: Principal) -> FindingRow:
    store.writer.call(lambda: _acknowledge_finding(store, finding_id, who))
    with store.sessions() as s:
        out = s.get(FindingRow, finding_id)
        if out is None:
            raise NotFound(f"finding {finding_id} not found")
        return out


def _acknowledge_finding(store: ControlStore, finding_id: int, who: Principal) -> None:
    with store.unit_of_work() as uow:
        row = uow.s.get(FindingRow, finding_id)
        if row is None:
            raise NotFound(f"finding {finding_id} not found")
        nc = _node(store, row.node)
        _ack(store, uow.s, nc, finding_id, who)
        uow.audit(who, "finding.acknowledge", str(finding_id), detail={"node": row.node})


def post_validation(store: ControlStore, payload: dict[str, Any], who: Principal) -> NodeView:
    """A validation result (``{"node": ..., "verdict": "pass"|"warn"|"fail", ...}``) moves a
    node out of ``validating``: pass/warn -> in_service, fail -> repair. A result for a node in
    repair or registering first moves it to validating; a fail for a node in service drains it."""
    node = payload.get("node")
    verdict = str(payload.get("verdict", "")).lower()
    if not isinstance(node, str) or not node:
        raise UsageError("validation result: field 'node' (string) is required")
    if verdict not in VERDICTS:
        raise UsageError(f"validation result: field 'verdict' must be one of {VERDICTS}")
    if who.role is Role.AGENT and not who.may_push_for(node):
        raise PermissionError(f"this agent token is bound to another node than {node!r}")
    store.writer.call(lambda: _post_validation(store, node, verdict, payload, who))
    return _view(store, node)


def _level(payload: dict[str, Any]) -> int:
    """The level a result says it ran at (1 when it does not say)."""
    try:
        return int(payload.get("level") or 1)
    except (TypeError, ValueError):
        return 1


def _asked_level(store: ControlStore, node: str) -> int:
    """The level the node must pass at now (a maintenance campaign may ask above 1)."""
    return store.asked_levels.get(node) or 1


def _post_validation(
    store: ControlStore, node: str, verdict: str, payload: dict[str, Any], who: Principal
) -> None:
    nc = _node(store, node)
    reason = f"validation result: {verdict}"
    summary = payload.get("summary")
    if isinstance(summary, str) and summary:
        reason += f" ({summary[:200]})"
    with store.unit_of_work() as uow:
        uow.s.add(
            ValidationResultRow(
                node=node,
                verdict=verdict,
                received_s=store.clock(),
                actor=who.actor,
                payload=payload,
            )
        )
        if nc.state in (S.REPAIR, S.REGISTERING, S.LOST):
            uow.move(nc, S.VALIDATING, actor=who.actor, reason=reason)
        asked = _asked_level(store, node)
        if nc.state == S.VALIDATING and verdict != "fail" and _level(payload) < asked:
            # a maintenance campaign asks a higher level: this result does not pass the node
            reason += f"; level {_level(payload)} does not pass: level {asked} asked"
            uow.audit(who, "validation.low_level", node, detail={"asked": asked})
        elif nc.state == S.VALIDATING:
            to = S.REPAIR if verdict == "fail" else S.IN_SERVICE
            uow.move(nc, to, actor=who.actor, reason=reason)
        elif nc.state == S.IN_SERVICE and verdict == "fail":
            uow.move(nc, S.DRAINING, actor=who.actor, reason=reason)
        uow.audit(who, "validation.post", node, detail={"verdict": verdict})


def update_node(
    store: ControlStore,
    name: str,
    who: Principal,
    *,
    rack: str | None = None,
    tenant: str | None = None,
    labels: dict[str, str] | None = None,
) -> NodeView:
    """Set a node's rack, tenant or labels (None: unchanged)."""
    store.writer.call(lambda: _update_node(store, name, who, rack, tenant, labels))
    return _view(store, name)


def _update_node(
    store: ControlStore,
    name: str,
    who: Principal,
    rack: str | None,
    tenant: str | None,
    labels: dict[str, str] | None,
) -> None:
    nc = _node(store, name)
    with store.unit_of_work() as uow:
        s = uow.s
        row = s.get(Node, nc.id)
        assert row is not None
        if rack is not None:
            r = s.scalars(select(Rack).where(Rack.name == rack)).first()
            if r is None:
                r = Rack(name=rack)
                s.add(r)
                s.flush()
            row.rack_id = r.id
            nc.rack = rack
        if tenant is not None:
            row.tenant = tenant or None
            nc.tenant = row.tenant
        if labels is not None:
            row.labels = dict(labels)
        uow.audit(
            who, "node.update", name, detail={"rack": rack, "tenant": tenant, "labels": labels}
        )


def set_policy(store: ControlStore, policy: RemediationPolicy, who: Principal) -> None:
    store.writer.call(lambda: _set_policy(store, policy, who))


def _set_policy(store: ControlStore, policy: RemediationPolicy, who: Principal) -> None:
    with store.unit_of_work() as uow:
        row = uow.s.get(ControllerState, "policy")
        if row is None:
            uow.s.add(ControllerState(key="policy", value=policy.model_dump()))
        else:
            row.value = policy.model_dump()
        store.policy = policy
        uow.update_breaker()
        uow.audit(who, "policy.update", "remediation", detail=policy.model_dump())


def create_token(
    store: ControlStore,
    who: Principal,
    role: str,
    name: str = "",
    tenant: str | None = None,
    node: str | None = None,
) -> tuple[str, int]:
    return store.writer.call(lambda: _create_token(store, who, role, name, tenant, node))


def _create_token(
    store: ControlStore,
    who: Principal,
    role: str,
    name: str,
    tenant: str | None,
    node: str | None,
) -> tuple[str, int]:
    with store.unit_of_work(bump=False) as uow:
        token, row = store.tokens.create(role, name=name, tenant=tenant, node=node, session=uow.s)
        uow.audit(
            who,
            "token.create",
            row.name,
            detail={"role": row.role, "tenant": tenant, "node": node, "id": row.id},
        )
        return token, row.id


def revoke_token(store: ControlStore, who: Principal, token_id: int) -> None:
    store.writer.call(lambda: _revoke_token(store, who, token_id))


def _revoke_token(store: ControlStore, who: Principal, token_id: int) -> None:
    with store.unit_of_work(bump=False) as uow:
        if not store.tokens.revoke(token_id, session=uow.s):
            raise NotFound(f"token {token_id} not found or already revoked")
        uow.audit(who, "token.revoke", str(token_id))
    store.tokens.forget()  # again after the commit: a resolve in between may have cached it
