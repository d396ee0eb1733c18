"""Fleet-wide power orders (issue 16): create (operators), restore (by hand or when policy's
``revert_after`` runs out, on the controller's tick), agents' reports, status.

An order is a row per order and a row per node (`gpufleet.control.db.models.PowerOrder`,
`PowerOrderNode`), written in one transaction with an audit row per node. The orders waiting
for agents are kept in a per-store map (`orders`) that the writer rebuilds after each change
and each tick, so the ingest path reads it without the database: an ``apply`` goes out to a
node until its agent's report is recorded, a ``restore`` once the order is restoring until its
report is recorded. A node that is offline simply gets its order with the answer to its first
batch when it is back; until then the order shows it ``pending``. Orders are keyed per order
and node (`order_key`), and the agent acts on a key once, so an order sent again after a
controller restart is never applied twice.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

from sqlalchemy import select

from gpufleet.control.db.models import EventRow, Gpu, Node, PowerOrder, PowerOrderNode
from gpufleet.control.power.spec import PowerOrderSpec, matches, named_nodes
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import TransitionError
from gpufleet.control.state.store import ControlStore, NotFound
from gpufleet.errors import UsageError
from gpufleet.wire import WirePowerOrder, WirePowerReport

ACTIVE, RESTORING, RESTORED = "active", "restoring", "restored"
# the agents' device events when they set an order's limit again (`gpufleet.agent.power_enforce`)
HELD_KINDS = ("power_limit_reapplied", "power_limit_reapply_failed")
HELD_SHOWN = 10  # the newest per node in an order's status
_orders: weakref.WeakKeyDictionary[ControlStore, dict[str, list[WirePowerOrder]]] = (
    weakref.WeakKeyDictionary()
)


def order_key(order_id: int, node: str, action: str) -> str:
    """The key an agent acts on once: order, node (hashed when long) and action."""
    name = node if len(node) <= 80 else hashlib.sha256(node.encode()).hexdigest()[:24]
    return f"po{order_id}-{name}-{action}"


def orders(store: ControlStore) -> dict[str, list[WirePowerOrder]]:
    """The power orders waiting for each node's agent (read from any thread)."""
    return _orders.get(store, {})


def refresh_orders(store: ControlStore) -> None:
    """Rebuild the order map from the database (on the writer)."""
    out: dict[str, list[WirePowerOrder]] = {}
    with store.sessions() as s:
        q = (
            select(PowerOrderNode, PowerOrder)
            .join(PowerOrder, PowerOrder.id == PowerOrderNode.order_id)
            .where(PowerOrder.state.in_((ACTIVE, RESTORING)))
            .order_by(PowerOrder.id)
        )
        for pn, po in s.execute(q):
            if po.state == ACTIVE and pn.applied is None:
                action = "apply"
            elif po.state == RESTORING and pn.restored is None:
                action = "restore"
            else:
                continue
            out.setdefault(pn.node, []).append(
                WirePowerOrder(
                    key=order_key(po.id, pn.node, action), action=action, limits=pn.limits
                )
            )
    _orders[store] = out


# -- create --------------------------------------------------------------------------------------
def select_nodes(store: ControlStore, spec: PowerOrderSpec, who: Principal) -> list[str]:
    """The nodes an order reaches, checked against the token: a tenant token may target only
    its own tenant's nodes (PermissionError otherwise; the caller audits it and applies
    nothing). Unknown named nodes and an empty selection are errors."""
    if not who.is_global and spec.tenant not in (None, who.tenant):
        raise PermissionError(
            f"a token of tenant {who.tenant!r} may not target tenant {spec.tenant!r}"
        )
    with store.sessions() as s:
        rows = {n.name: (n.tenant, dict(n.labels or {})) for n in s.scalars(select(Node))}
    missing = [n for n in named_nodes(spec) if n not in rows]
    if missing:
        if not who.is_global:  # never tell a tenant which names exist elsewhere
            raise PermissionError(f"node(s) {', '.join(missing[:5])} are not of this tenant")
        raise UsageError(f"unknown node(s): {', '.join(missing[:5])}")
    chosen = sorted(n for n, (t, labels) in rows.items() if matches(spec, n, t, labels))
    foreign = [n for n in chosen if not who.owns(rows[n][0])]
    if foreign:  # never named: a tenant sees no other tenant's nodes
        raise PermissionError(
            f"the selection reaches nodes outside tenant {who.tenant!r}; nothing applied "
            f"(--tenant {who.tenant} selects only its own)"
        )
    if not chosen:
        raise UsageError("no node matches the selector")
    _check_ranges(store, spec, chosen)
    return chosen


def _check_ranges(store: ControlStore, spec: PowerOrderSpec, nodes: list[str]) -> None:
    """Every limit within its GPU's allowed range as the agent reported it (NVML's power
    management limit constraints); a GPU whose range is unknown is left to its agent, which
    reports NVML's refusal per GPU."""
    wanted = set(nodes)
    with store.sessions() as s:
        q = select(Node.name, Gpu.index, Gpu.info).join(Gpu, Gpu.node_id == Node.id)
        gpus = [(n, i, info or {}) for n, i, info in s.execute(q) if n in wanted]
    for node, index, info in sorted(gpus, key=lambda g: (g[0], g[1])):
        plan = spec.limits_for(node)
        watts = plan.get(str(index), plan.get("*"))
        low, high = info.get("power_limit_min_w"), info.get("power_limit_max_w")
        if watts is None or low is None or high is None:
            continue
        if not float(low) <= watts <= float(high):
            raise UsageError(
                f"limit {watts:g} W is outside GPU {index} of {node}'s allowed range "
                f"{float(low):g}-{float(high):g} W; nothing applied"
            )


def checked_nodes(store: ControlStore, spec: PowerOrderSpec, who: Principal) -> list[str]:
    """`select_nodes` for an operator or admin token; a refusal is audited and raised."""
    try:
        if not who.at_least(Role.OPERATOR) or who.role is Role.AGENT:
            raise PermissionError("power orders need an operator or admin token")
        return select_nodes(store, spec, who)
    except PermissionError as exc:
        store.audit_refusal(who, "power.apply", "", str(exc))
        raise


def plan(store: ControlStore, spec: PowerOrderSpec, who: Principal) -> dict[str, Any]:
    """What an order would do (``dry_run``), or raise as `create` would."""
    nodes = checked_nodes(store, spec, who)
    return {
        "dry_run": True,
        "nodes": [{"node": n, "limits": spec.limits_for(n), "state": "would apply"} for n in nodes],
        "revert_after_s": spec.revert_after_s,
    }


def create(store: ControlStore, spec: PowerOrderSpec, who: Principal) -> int:
    """Record the order (nodes selected and checked first, off the writer)."""
    nodes = checked_nodes(store, spec, who)
    return store.writer.call(lambda: _create(store, spec, who, nodes))


def _create(store: ControlStore, spec: PowerOrderSpec, who: Principal, nodes: list[str]) -> int:
    now = store.clock()
    with store.sessions.begin() as s:
        po = PowerOrder(
            state=ACTIVE,
            spec=spec.model_dump(mode="json", exclude_none=True),
            tenant=who.tenant,
            created_s=now,
            created_by=who.actor,
            revert_at_s=now + spec.revert_after_s if spec.revert_after_s else None,
        )
        s.add(po)
        s.flush()
        for n in nodes:
            limits = spec.limits_for(n)
            s.add(PowerOrderNode(order_id=po.id, node=n, limits=limits))
            store.audit(s, who, "power.apply", n, detail={"order": po.id, "limits": limits})
        oid = po.id
    refresh_orders(store)
    return oid


# -- restore -------------------------------------------------------------------------------------
def restore(store: ControlStore, oid: int, who: Principal) -> None:
    """Start putting an order's limits back (its nodes' agents get a restore)."""
    doc = status(store, oid)
    if not who.is_global and doc["tenant"] != who.tenant:
        store.audit_refusal(who, "power.restore", f"power-order:{oid}", "another tenant's order")
        raise PermissionError(f"power order {oid} is not of tenant {who.tenant!r}")
    store.writer.call(lambda: _restore(store, oid, who))


POLICY = Principal(None, "revert_after", Role.OPERATOR)  # the actor of policy's reverts


def _restore(store: ControlStore, oid: int, who: Principal) -> None:
    with store.sessions.begin() as s:
        po = s.get(PowerOrder, oid)
        if po is None:
            raise NotFound(f"power order {oid} not found")
        if po.state != ACTIVE:
            raise TransitionError(f"power order {oid} is {po.state}: nothing to restore")
        po.state, po.restore_s, po.restore_by = RESTORING, store.clock(), who.actor
        for pn in s.scalars(select(PowerOrderNode).where(PowerOrderNode.order_id == oid)):
            store.audit(s, who, "power.restore", pn.node, detail={"order": oid})
    refresh_orders(store)


def _revert_due(store: ControlStore) -> None:
    """Orders whose ``revert_after`` ran out start restoring (policy, on the writer)."""
    now = store.clock()
    with store.sessions() as s:
        due = list(
            s.scalars(
                select(PowerOrder.id).where(
                    PowerOrder.state == ACTIVE,
                    PowerOrder.revert_at_s.is_not(None),
                    PowerOrder.revert_at_s <= now,
                )
            )
        )
    for oid in due:
        _restore(store, oid, POLICY)


def run_pass(store: ControlStore) -> None:
    _revert_due(store)
    refresh_orders(store)


def tick(store: ControlStore) -> None:
    """Policy reverts and a fresh order map (on the writer, from the controller's loop)."""
    store.writer.call(lambda: run_pass(store))


# -- an agent's report ---------------------------------------------------------------------------
def report(store: ControlStore, rep: WirePowerReport, who: Principal) -> bool:
    """Record an apply's or restore's outcome; True when it was awaited (a repeat is ignored)."""
    if who.role is Role.AGENT:
        if not who.may_push_for(rep.node):
            raise PermissionError(f"this agent token is bound to another node than {rep.node!r}")
    elif not who.at_least(Role.ADMIN):
        raise PermissionError("power reports come from the node's agent (or an admin)")
    return store.writer.call(lambda: _report(store, rep, who))


def _report(store: ControlStore, rep: WirePowerReport, who: Principal) -> bool:
    head, _, action = rep.key.rpartition("-")
    if not rep.key.startswith("po") or action not in ("apply", "restore"):
        return False
    try:
        oid = int(head[2:].split("-", 1)[0])
    except ValueError:
        return False
    taken = False
    with store.sessions.begin() as s:
        pn = s.get(PowerOrderNode, (oid, rep.node))
        if pn is None or order_key(oid, rep.node, action) != rep.key:
            return False
        doc = {**rep.model_dump(mode="json"), "received_s": store.clock()}
        if action == "apply" and pn.applied is None:
            pn.applied, pn.applied_s, taken = doc, store.clock(), True
        elif action == "restore" and pn.restored is None:
            pn.restored, pn.restored_s, taken = doc, store.clock(), True
        if taken:
            store.audit(
                s,
                who,
                f"power.{action}.report",
                rep.node,
                outcome=_outcome(doc),
                detail={"order": oid, "gpus": doc["gpus"], "error": rep.error},
            )
            po = s.get(PowerOrder, oid)
            if po is not None and po.state == RESTORING:
                left = s.scalars(
                    select(PowerOrderNode).where(
                        PowerOrderNode.order_id == oid, PowerOrderNode.restored.is_(None)
                    )
                ).first()
                if left is None:
                    po.state = RESTORED
    if taken:
        refresh_orders(store)
    return taken


def _outcome(doc: dict[str, Any] | None) -> str:
    """``pending`` (no report yet), ``ok``, ``partial`` (some GPUs refused), ``failed``."""
    if doc is None:
        return "pending"
    if doc.get("error"):
        return "cancelled" if str(doc["error"]).startswith("cancelled") else "failed"
    gpus = doc.get("gpus") or []
    ok = sum(1 for g in gpus if g.get("ok"))
    if ok == len(gpus):
        return "ok"
    return "partial" if ok else "failed"


# -- status --------------------------------------------------------------------------------------
def status(store: ControlStore, oid: int) -> dict[str, Any]:
    """One order with each node's outcome (``pending`` until its agent answers)."""
    with store.sessions() as s:
        po = s.get(PowerOrder, oid)
        if po is None:
            raise NotFound(f"power order {oid} not found")
        nodes = list(
            s.scalars(
                select(PowerOrderNode)
                .where(PowerOrderNode.order_id == oid)
                .order_by(PowerOrderNode.node)
            )
        )
        doc = _doc(po, nodes)
        for row in doc["nodes"]:
            row["held"] = _held(s, po, row["node"])
        return doc


def _held(s: Any, po: PowerOrder, node: str) -> list[dict[str, Any]]:
    """The node's agent setting this order's limit again (after a reboot, a driver reload, a
    limit changed by hand) or failing to: its device events, newest first."""
    mark = f"(order {order_key(po.id, node, 'apply')})"
    q = (
        select(EventRow)
        .where(
            EventRow.node == node,
            EventRow.kind.in_(HELD_KINDS),
            EventRow.at_s >= po.created_s,
            EventRow.message.contains(mark, autoescape=True),
        )
        .order_by(EventRow.id.desc())
        .limit(HELD_SHOWN)
    )
    return [
        {
            "at_s": e.at_s,
            "kind": e.kind,
            "gpu": (e.data or {}).get("gpu_index"),
            "detail": str((e.data or {}).get("detail") or e.message),
        }
        for e in s.scalars(q)
    ]


def listing(store: ControlStore, who: Principal, limit: int = 50) -> list[dict[str, Any]]:
    """The newest orders ``who`` may read (a tenant token: its tenant's), nodes summarised."""
    with store.sessions() as s:
        q = select(PowerOrder).order_by(PowerOrder.id.desc()).limit(limit)
        if not who.is_global:
            q = q.where(PowerOrder.tenant == who.tenant)
        out = []
        for po in s.scalars(q):
            nodes = list(s.scalars(select(PowerOrderNode).where(PowerOrderNode.order_id == po.id)))
            out.append(_doc(po, nodes))
        return out


def _doc(po: PowerOrder, nodes: list[PowerOrderNode]) -> dict[str, Any]:
    rows = []
    by: dict[str, int] = {}
    for pn in nodes:
        applied, restored = _outcome(pn.applied), _outcome(pn.restored)
        by[applied] = by.get(applied, 0) + 1
        rows.append(
            {
                "node": pn.node,
                "limits": pn.limits,
                "apply": applied,
                "restore": restored if po.state != ACTIVE else None,
                "gpus": (pn.applied or {}).get("gpus", []),
                "error": (pn.applied or {}).get("error"),
                "restored_gpus": (pn.restored or {}).get("gpus", []),
                "restore_error": (pn.restored or {}).get("error"),
            }
        )
    return {
        "id": po.id,
        "state": po.state,
        "spec": po.spec,
        "tenant": po.tenant,
        "created_s": po.created_s,
        "created_by": po.created_by,
        "revert_at_s": po.revert_at_s,
        "restore_s": po.restore_s,
        "restore_by": po.restore_by,
        "by_outcome": by,
        "nodes": rows,
    }
