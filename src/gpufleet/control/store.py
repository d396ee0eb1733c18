"""The control plane's state: writes (ingest, lifecycle, actions, validation, audit) through one
lock and one transaction each, with an in-memory cache of nodes for the hot paths.

The database is the source of truth; the cache is rebuilt from it at start and after any failed
transaction. Raw samples go to the in-memory `TelemetryStore` only after the batch's transaction
has committed, so a replayed batch never counts twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, delete, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gpufleet.agent.wire import Ack, Batch, WireFinding
from gpufleet.control import lifecycle as lc
from gpufleet.control.auth import Principal, TokenStore
from gpufleet.control.db import session_factory
from gpufleet.control.lifecycle import LOSABLE, OUT_STATES, NodeState, SchedulerHook
from gpufleet.control.models import (
    AuditEntry,
    ControllerState,
    EventRow,
    FindingRow,
    Gpu,
    IngestedBatch,
    Node,
    Rack,
    Rollup,
)
from gpufleet.control.remediation import CircuitBreaker, RemediationPolicy, decide
from gpufleet.control.telemetry_store import TelemetryStore, merge_stats

log = logging.getLogger("gpufleet.control")
Clock = Callable[[], float]
S = NodeState


@dataclass
class FindingCache:
    """What the hot path needs to know about an active finding."""

    id: int
    severity: int
    sticky: bool
    present: bool = True
    acknowledged: bool = False


@dataclass
class GpuCache:
    id: int
    uuid: str
    model: str | None
    digest: str = ""
    power_limit_w: float | None = None


@dataclass
class NodeCache:
    """A node as the hot paths see it; mirrors its `Node` row."""

    id: int
    name: str
    state: str
    health: int = 3
    cordoned: bool = False
    tenant: str | None = None
    rack: str | None = None
    agent_id: str | None = None
    interval_s: float = 2.0
    last_seen_s: float | None = None
    persisted_seen_s: float = 0.0
    state_since_s: float = 0.0
    state_reason: str = ""
    gpus: dict[int, GpuCache] = field(default_factory=dict)
    findings: dict[tuple[str, str], FindingCache] = field(default_factory=dict)

    @property
    def model(self) -> str | None:
        return next((g.model for g in self.gpus.values() if g.model), None)


@dataclass(frozen=True)
class IngestItem:
    """A parsed batch waiting for its group commit."""

    batch: Batch
    principal: Principal
    received_s: float
    arrays: list[Any] | None = None  # per sample block: (t array, metric matrix), if parsed


class NotFound(LookupError):
    """A named node, finding or token does not exist (the API answers 404)."""


def _digest(info: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()


class ControlStore:
    """Writes and cached state of the control plane (one instance per controller process)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock,
        policy: RemediationPolicy | None = None,
        hook: SchedulerHook | None = None,
        telemetry: TelemetryStore | None = None,
        lost_after_intervals: int = 3,
        min_drain_s: float = 10.0,
        seen_persist_s: float = 10.0,
    ) -> None:
        self.engine = engine
        self.sessions = session_factory(engine)
        self.clock = clock
        self.policy = policy or RemediationPolicy()
        self.hook: SchedulerHook = hook or lc.NullSchedulerHook()
        self.telemetry = telemetry or TelemetryStore()
        self.tokens = TokenStore(self.sessions, clock)
        self.lost_after_intervals = lost_after_intervals
        self.min_drain_s = min_drain_s
        self.seen_persist_s = seen_persist_s
        self.breaker = CircuitBreaker()
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeCache] = {}
        self.generation = 0
        self.grace_from_s = clock()  # a fresh controller gives every node a grace period
        self.stats = {"batches": 0, "duplicates": 0, "samples": 0}
        self.load()

    # -- cache --------------------------------------------------------------------------------
    def load(self) -> None:
        """(Re)build the node cache from the database."""
        with self.sessions() as s:
            racks = {r.id: r.name for r in s.scalars(select(Rack))}
            nodes: dict[str, NodeCache] = {}
            by_id: dict[int, NodeCache] = {}
            for n in s.scalars(select(Node)):
                nc = NodeCache(
                    id=n.id,
                    name=n.name,
                    state=n.state,
                    health=n.health,
                    cordoned=n.cordoned,
                    tenant=n.tenant,
                    rack=racks.get(n.rack_id) if n.rack_id else None,
                    agent_id=n.agent_id,
                    interval_s=n.heartbeat_interval_s,
                    last_seen_s=n.last_seen_s,
                    persisted_seen_s=n.last_seen_s or 0.0,
                    state_since_s=n.state_since_s,
                    state_reason=n.state_reason,
                )
                nodes[n.name] = nc
                by_id[n.id] = nc
            for g in s.scalars(select(Gpu)):
                nc = by_id[g.node_id]
                nc.gpus[g.index] = GpuCache(
                    g.id, g.uuid, g.model, _digest(g.info), g.info.get("power_limit_enforced_w")
                )
            for f in s.scalars(select(FindingRow).where(FindingRow.active.is_(True))):
                if f.node in nodes:
                    nodes[f.node].findings[(f.code, f.component)] = FindingCache(
                        f.id, f.severity, f.sticky, True, f.acknowledged_by is not None
                    )
            saved = s.get(ControllerState, "policy")
            if saved is not None:
                self.policy = RemediationPolicy.model_validate(saved.value)
        self.nodes = nodes
        self._update_breaker(None)

    def out_count(self) -> tuple[int, int]:
        nodes = list(self.nodes.values())
        return sum(1 for n in nodes if n.state in OUT_STATES), len(nodes)

    def _update_breaker(self, s: Session | None) -> None:
        out, total = self.out_count()
        changed = self.breaker.update(out, total, self.policy.max_out_fraction, self.clock())
        if changed is not None and s is not None:
            s.add(
                EventRow(
                    at_s=self.clock(),
                    kind="circuit_breaker_open" if changed else "circuit_breaker_closed",
                    severity=2 if changed else 0,
                    message=self.breaker.message,
                    data={"out": out, "total": total, "limit": self.policy.max_out_fraction},
                )
            )

    def _bump(self) -> None:
        self.generation += 1

    # -- transitions ----------------------------------------------------------------------------
    def _move(
        self,
        s: Session,
        nc: NodeCache,
        to: NodeState,
        *,
        actor: str,
        reason: str,
        after: lc.PostCommit,
    ) -> None:
        row = s.get(Node, nc.id)
        assert row is not None
        now = self.clock()
        lc.transition(
            s, row, to, actor=actor, reason=reason, now_s=now, hook=self.hook, after=after
        )
        nc.state, nc.state_since_s, nc.state_reason = to.value, now, reason
        if to is S.IN_SERVICE:
            row.cordoned = nc.cordoned = False
        self._update_breaker(s)

    def _maybe_in_service(
        self, s: Session, nc: NodeCache, actor: str, after: lc.PostCommit
    ) -> None:
        if nc.state != S.VALIDATING or self.policy.require_validation:
            return
        if nc.health >= 2 or any(f.severity >= 2 for f in nc.findings.values()):
            return
        self._move(
            s,
            nc,
            S.IN_SERVICE,
            actor=actor,
            after=after,
            reason="validation not required by policy and the agent reports no fail finding",
        )

    # -- ingest -------------------------------------------------------------------------------
    def touch(self, node: str, now_s: float) -> None:
        """A node was heard from (even a refused batch proves it is alive)."""
        nc = self.nodes.get(node)
        if nc is not None and (nc.last_seen_s is None or now_s > nc.last_seen_s):
            nc.last_seen_s = now_s

    def apply_batches(self, items: list[IngestItem]) -> list[Ack]:
        """Store a group of batches in one transaction; duplicates are acknowledged, not stored."""
        with self.lock:
            after: lc.PostCommit = []
            acks: list[Ack] = []
            fresh: list[IngestItem] = []
            try:
                with self.sessions.begin() as s:
                    keys = list({(i.batch.agent_id, i.batch.seq) for i in items})
                    known: set[tuple[str, int]] = set()
                    for chunk in range(0, len(keys), 400):
                        part = keys[chunk : chunk + 400]
                        q = select(IngestedBatch.agent_id, IngestedBatch.seq).where(
                            tuple_(IngestedBatch.agent_id, IngestedBatch.seq).in_(part)
                        )
                        known.update((a, q_) for a, q_ in s.execute(q))
                    rows = []
                    node_updates: dict[int, dict[str, Any]] = {}
                    for item in items:
                        b = item.batch
                        key = (b.agent_id, b.seq)
                        if key in known:
                            acks.append(Ack(agent_id=b.agent_id, seq=b.seq, duplicate=True))
                            self.touch(b.node, item.received_s)
                            continue
                        known.add(key)
                        n_samples = sum(len(ws.t) for ws in b.samples)
                        rows.append(
                            {
                                "agent_id": b.agent_id,
                                "seq": b.seq,
                                "node": b.node,
                                "received_s": item.received_s,
                                "sent_at_s": b.sent_at_s,
                                "samples": n_samples,
                                "findings": len(b.findings),
                                "events": len(b.events),
                                "buffered": b.buffered,
                                "token_id": item.principal.token_id,
                            }
                        )
                        self._apply_one(s, item, node_updates, after)
                        acks.append(Ack(agent_id=b.agent_id, seq=b.seq))
                        fresh.append(item)
                    if rows:
                        s.execute(insert(IngestedBatch), rows)
                    if node_updates:
                        s.execute(update(Node), list(node_updates.values()))
            except Exception:
                log.exception("ingest transaction failed; reloading state from the database")
                self.load()
                raise
            for item in fresh:
                node = item.batch.node
                for j, ws in enumerate(item.batch.samples):
                    if item.arrays is not None:
                        tarr, mat = item.arrays[j]
                        n = self.telemetry.add_arrays(node, ws.gpu_index, tarr, mat)
                    else:
                        n = self.telemetry.add(node, ws.gpu_index, ws.t, ws.fields)
                    self.stats["samples"] += n
            self.stats["batches"] += len(fresh)
            self.stats["duplicates"] += len(items) - len(fresh)
            self._run_after(after)
            self._bump()
            return acks

    def _run_after(self, after: lc.PostCommit) -> None:
        for fn in after:
            try:
                fn()
            except Exception as exc:
                log.warning("scheduler hook failed: %s", exc)

    def _apply_one(
        self,
        s: Session,
        item: IngestItem,
        node_updates: dict[int, dict[str, Any]],
        after: lc.PostCommit,
    ) -> None:
        b = item.batch
        now = self.clock()
        actor = f"agent:{b.agent_id}"
        nc = self.nodes.get(b.node)
        if nc is None:
            row = Node(
                name=b.node,
                state=S.REGISTERING.value,
                state_since_s=now,
                state_reason="",
                health=b.health,
                agent_id=b.agent_id,
                heartbeat_interval_s=b.heartbeat_interval_s,
                last_seen_s=item.received_s,
                registered_s=now,
                labels={},
                tenant=item.principal.tenant,
            )
            s.add(row)
            s.flush()
            lc.register(
                s, row, actor=actor, reason=f"first batch from agent {b.agent_id}", now_s=now
            )
            nc = NodeCache(
                id=row.id,
                name=b.node,
                state=S.REGISTERING.value,
                health=b.health,
                agent_id=b.agent_id,
                interval_s=b.heartbeat_interval_s,
                tenant=row.tenant,
                last_seen_s=item.received_s,
                persisted_seen_s=item.received_s,
                state_since_s=now,
                state_reason=row.state_reason,
            )
            self.nodes[b.node] = nc
        self.touch(b.node, item.received_s)
        if b.devices is not None:
            for d in b.devices:
                self._upsert_gpu(s, nc, d.index, d.uuid, d.info, now)
        for ws in b.samples:
            if ws.gpu_index not in nc.gpus:
                self._upsert_gpu(s, nc, ws.gpu_index, ws.gpu_uuid, {"uuid": ws.gpu_uuid}, now)
        changed = (
            b.health != nc.health
            or b.agent_id != nc.agent_id
            or b.heartbeat_interval_s != nc.interval_s
            or item.received_s - nc.persisted_seen_s >= self.seen_persist_s
        )
        nc.health, nc.agent_id, nc.interval_s = b.health, b.agent_id, b.heartbeat_interval_s
        if changed:
            nc.persisted_seen_s = item.received_s
            node_updates[nc.id] = {
                "id": nc.id,
                "health": b.health,
                "agent_id": b.agent_id,
                "heartbeat_interval_s": b.heartbeat_interval_s,
                "last_seen_s": nc.last_seen_s,
            }
        if b.events:
            s.execute(
                insert(EventRow),
                [
                    {
                        "at_s": e.timestamp_s,
                        "node": b.node,
                        "kind": e.kind,
                        "severity": 2 if e.kind == "gpu_lost" else 1,
                        "message": f"GPU {e.gpu_index}: {e.kind}"
                        + (f" XID {e.xid}" if e.xid is not None else "")
                        + (f": {e.detail}" if e.detail else ""),
                        "data": e.model_dump(mode="json"),
                    }
                    for e in b.events
                ],
            )
        # Lifecycle from the agent's side.
        if nc.state == S.LOST:
            before = s.get(Node, nc.id)
            prev = before.state_before_lost if before is not None else None
            back = S(prev) if prev in (S.DRAINING, S.DRAINED) else S.VALIDATING
            self._move(
                s,
                nc,
                back,
                actor=actor,
                after=after,
                reason=f"heartbeats resumed (agent {b.agent_id})",
            )
        if nc.state == S.REGISTERING:
            self._move(
                s,
                nc,
                S.VALIDATING,
                actor=actor,
                after=after,
                reason=f"agent reported {len(nc.gpus)} GPU(s)",
            )
        self._apply_findings(s, nc, b.findings, now, after)
        self._maybe_in_service(s, nc, actor, after)

    def _upsert_gpu(
        self, s: Session, nc: NodeCache, index: int, uuid: str, info: dict[str, Any], now: float
    ) -> None:
        digest = _digest(info)
        cur = nc.gpus.get(index)
        if cur is not None and cur.digest == digest:
            return
        model = info.get("model")
        name = str(info.get("name") or "")
        plimit = info.get("power_limit_enforced_w")
        if cur is None:
            row = Gpu(
                node_id=nc.id,
                index=index,
                uuid=uuid,
                name=name,
                model=model,
                info=info,
                updated_s=now,
            )
            s.add(row)
            s.flush()
            nc.gpus[index] = GpuCache(row.id, uuid, model, digest, plimit)
        else:
            s.execute(
                update(Gpu)
                .where(Gpu.id == cur.id)
                .values(uuid=uuid, name=name, model=model, info=info, updated_s=now)
            )
            nc.gpus[index] = GpuCache(cur.id, uuid, model, digest, plimit)

    def _apply_findings(
        self,
        s: Session,
        nc: NodeCache,
        snapshot: list[WireFinding],
        now: float,
        after: lc.PostCommit,
    ) -> None:
        current = {(f.code, f.component): f for f in snapshot}
        for key, fc in list(nc.findings.items()):
            if key in current:
                continue
            fc.present = False
            if fc.sticky and not fc.acknowledged:
                continue
            s.execute(
                update(FindingRow)
                .where(FindingRow.id == fc.id)
                .values(active=False, cleared_s=now, last_seen_s=now)
            )
            s.add(
                EventRow(
                    at_s=now,
                    node=nc.name,
                    kind="finding_cleared",
                    message=f"{key[0]} on {key[1]} cleared",
                )
            )
            del nc.findings[key]
        for key, wf in current.items():
            cur = nc.findings.get(key)
            if cur is not None:
                cur.present = True
                if wf.severity == cur.severity:
                    continue
                s.execute(
                    update(FindingRow)
                    .where(FindingRow.id == cur.id)
                    .values(severity=wf.severity, message=wf.message, last_seen_s=now)
                )
                escalated = wf.severity >= 2 > cur.severity
                cur.severity = wf.severity
                if escalated:
                    self._remediate(s, nc, wf, after)
                continue
            row = FindingRow(
                node=nc.name,
                code=wf.code,
                component=wf.component,
                rule=wf.rule,
                severity=wf.severity,
                message=wf.message,
                action=wf.action,
                evidence=wf.evidence,
                sticky=wf.sticky,
                gpu_index=wf.gpu_index,
                first_seen_s=wf.first_seen_s or now,
                last_seen_s=wf.last_seen_s or now,
                active=True,
            )
            s.add(row)
            s.flush()
            nc.findings[key] = FindingCache(row.id, wf.severity, wf.sticky)
            s.add(
                EventRow(
                    at_s=now,
                    node=nc.name,
                    kind="finding",
                    severity=min(wf.severity, 2),
                    message=f"{wf.code} on {wf.component}: {wf.message}",
                    data={"finding_id": row.id, "action": wf.action},
                )
            )
            if wf.severity >= 2:
                self._remediate(s, nc, wf, after)

    def _remediate(self, s: Session, nc: NodeCache, wf: WireFinding, after: lc.PostCommit) -> None:
        if nc.state not in (S.IN_SERVICE, S.VALIDATING):
            return
        self._update_breaker(s)
        d = decide(
            self.policy, self.breaker, code=wf.code, severity=wf.severity, message=wf.message
        )
        now = self.clock()
        if d.outcome == "drain":
            self._move(s, nc, S.DRAINING, actor="remediation", reason=d.reason, after=after)
        elif d.outcome in ("blocked", "dry_run"):
            if d.outcome == "blocked":
                log.warning("node %s: %s", nc.name, d.reason)
            s.add(
                EventRow(
                    at_s=now,
                    node=nc.name,
                    kind=f"remediation_{d.outcome}",
                    severity=2 if d.outcome == "blocked" else 1,
                    message=d.reason,
                    data={"code": wf.code, "would": "drain"},
                )
            )

    # -- periodic work ------------------------------------------------------------------------
    def note_own_gap(self, gap_s: float) -> None:
        """The controller itself was not running for ``gap_s``: restart every node's grace."""
        with self.lock, self.sessions.begin() as s:
            self.grace_from_s = self.clock()
            msg = (
                f"controller loop did not run for {gap_s:.1f} s; every node gets a grace "
                f"period before it can be declared lost"
            )
            log.warning(msg)
            s.add(
                EventRow(
                    at_s=self.grace_from_s,
                    kind="controller_gap",
                    severity=1,
                    message=msg,
                    data={"gap_s": gap_s},
                )
            )
            self._bump()

    def check_nodes(self) -> list[tuple[str, str]]:
        """Declare lost nodes, complete drains; returns (node, new state) pairs."""
        now = self.clock()
        moved: list[tuple[str, str]] = []
        with self.lock:
            after: lc.PostCommit = []
            with self.sessions.begin() as s:
                for nc in list(self.nodes.values()):
                    st = S(nc.state)
                    if st in LOSABLE:
                        seen = max(nc.last_seen_s or 0.0, self.grace_from_s)
                        limit = self.lost_after_intervals * nc.interval_s
                        if now - seen > limit:
                            self._move(
                                s,
                                nc,
                                S.LOST,
                                actor="controller",
                                after=after,
                                reason=f"no heartbeat for {now - seen:.1f} s "
                                f"({self.lost_after_intervals} x {nc.interval_s:g} s)",
                            )
                            moved.append((nc.name, S.LOST.value))
                            continue
                    if (
                        st is S.DRAINING
                        and now - nc.state_since_s >= self.min_drain_s
                        and self.hook.is_idle(nc.name)
                    ):
                        self._move(
                            s,
                            nc,
                            S.DRAINED,
                            actor="controller",
                            after=after,
                            reason="no work left on the node",
                        )
                        moved.append((nc.name, S.DRAINED.value))
            self._run_after(after)
            if moved:
                self._bump()
        return moved

    def flush_rollups(self, *, everything: bool = False) -> int:
        """Persist closed minutes (all of them when ``everything``, at shutdown)."""
        items = self.telemetry.take_closed_minutes(self.clock(), all_minutes=everything)
        if not items:
            return 0
        with self.lock, self.sessions.begin() as s:
            minutes = sorted({m for _, _, m, _, _ in items})
            existing = {
                (r.node, r.gpu_index, r.minute_s): r
                for r in s.scalars(select(Rollup).where(Rollup.minute_s.in_(minutes)))
            }
            new_rows = []
            for node, gpu, minute, n, stats in items:
                old = existing.get((node, gpu, minute))
                if old is not None:
                    old.stats = merge_stats(old.stats, stats)
                    old.samples += n
                else:
                    new_rows.append(
                        {
                            "node": node,
                            "gpu_index": gpu,
                            "minute_s": minute,
                            "samples": n,
                            "stats": stats,
                        }
                    )
            if new_rows:
                s.execute(insert(Rollup), new_rows)
        return len(items)

    def apply_retention(self, *, rollups_s: float, batches_s: float, events_s: float) -> None:
        now = self.clock()
        with self.lock, self.sessions.begin() as s:
            s.execute(delete(Rollup).where(Rollup.minute_s < now - rollups_s))
            s.execute(delete(IngestedBatch).where(IngestedBatch.received_s < now - batches_s))
            s.execute(delete(EventRow).where(EventRow.at_s < now - events_s))

    # -- audit --------------------------------------------------------------------------------
    def audit(
        self,
        s: Session,
        who: Principal,
        action: str,
        target: str = "",
        outcome: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        s.add(
            AuditEntry(
                at_s=self.clock(),
                actor=who.actor,
                role=who.role.value,
                action=action,
                target=target,
                outcome=outcome,
                detail=detail or {},
            )
        )

    def audit_refusal(self, who: Principal, action: str, target: str, why: str) -> None:
        with self.sessions.begin() as s:
            self.audit(s, who, action, target, outcome="refused", detail={"reason": why})
