"""Ingest writes: one group of batches in one transaction (group commit), with Core
executemany for the rows every batch writes (its (node, agent_id, seq) key, heartbeats, events) and
the ORM only where something changed (a new node or GPU, changed device info, a finding that
appeared, changed or cleared, a lifecycle transition).

Duplicates (a key already stored, or twice in one group) are acknowledged, not stored. Raw
samples go to the in-memory `TelemetryStore` only after the transaction has committed, so a
replayed batch never counts twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, and_, insert, or_, select, tuple_, update
from sqlalchemy.orm import Session

from gpufleet.control.db.away import log_failure
from gpufleet.control.db.models import EventRow, FindingRow, Gpu, IngestedBatch, Node, Transition
from gpufleet.control.ingest.energy import account_energy
from gpufleet.control.state import lifecycle as lc
from gpufleet.control.state.cache import FindingCache, GpuCache, IngestItem, NodeCache, info_digest
from gpufleet.control.state.lifecycle import NodeState
from gpufleet.control.state.remediation import decide
from gpufleet.wire import Ack, WireAck, WireFinding

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore
    from gpufleet.control.state.uow import UnitOfWork

log = logging.getLogger("gpufleet.control")
S = NodeState
KEY_CHUNK = 300  # (node, agent_id, seq) keys per lookup: under SQLite's 999 bound parameters


def _ack(agent_id: str, seq: int, duplicate: bool, acks: list[WireAck]) -> Ack:
    # every field given: pydantic inspects a default factory's signature on each construct
    return Ack.model_construct(
        agent_id=agent_id, seq=seq, duplicate=duplicate, commands=[], acks=acks, dropped={}
    )


def _sample_count(item: IngestItem) -> int:
    if item.sample_count is not None:
        return item.sample_count
    return sum(len(ws.t) for ws in item.batch.samples)


def _block_gpus(item: IngestItem) -> Iterable[tuple[int, str]]:
    """(index, UUID) of the GPUs the batch's sample blocks name (a GPU first seen there is
    registered with its UUID)."""
    if item.sample_count is not None:
        return item.block_gpus
    return ((ws.gpu_index, ws.gpu_uuid) for ws in item.batch.samples)


def node_acks(nc: NodeCache | None) -> list[WireAck]:
    """The acknowledgements the node's agent gets in its ``Ack``: sticky findings acknowledged
    on the control plane that the agent still reports (derived from the finding rows, so they
    survive a restart of the controller)."""
    if nc is None or not nc.findings:
        return []
    return [fc.ack for fc in nc.findings.values() if fc.ack is not None and fc.present]


def known_keys_query(keys: list[tuple[str, str, int]], *, sqlite: bool) -> Select[str, str, int]:
    """The stored batch keys among ``keys``: one index search per key. SQLite plans a row-value
    ``IN`` as a scan of the whole key index (``EXPLAIN QUERY PLAN``: ``SCAN ... COVERING
    INDEX``), a cost that grew with the 7 days of keys kept (31 ms per group commit at 300,000
    keys, against 1.5 ms for the same 50 keys as an ``OR`` of equalities, which it searches
    key by key); PostgreSQL searches the index for either form."""
    cols = (IngestedBatch.node, IngestedBatch.agent_id, IngestedBatch.seq)
    if sqlite:
        b = IngestedBatch
        return select(*cols).where(
            or_(*(and_(b.node == n, b.agent_id == a, b.seq == q) for n, a, q in keys))
        )
    return select(*cols).where(tuple_(*cols).in_(keys))


def apply_batches(store: ControlStore, items: list[IngestItem]) -> list[Ack]:
    """Store a group of batches in one transaction (on the writer thread); returns one `Ack`
    per item, in order."""
    acks: list[Ack] = []
    fresh: list[IngestItem] = []
    try:
        with store.unit_of_work() as uow:
            s = uow.s
            keys = list({(i.batch.node, i.batch.agent_id, i.batch.seq) for i in items})
            known: set[tuple[str, str, int]] = set()
            sqlite = s.get_bind().dialect.name == "sqlite"
            for chunk in range(0, len(keys), KEY_CHUNK):
                q = known_keys_query(keys[chunk : chunk + KEY_CHUNK], sqlite=sqlite)
                known.update((n, a, q_) for n, a, q_ in s.execute(q))
            rows = []
            node_updates: dict[int, dict[str, Any]] = {}
            events: list[dict[str, Any]] = []
            for item in items:
                b = item.batch
                key = (b.node, b.agent_id, b.seq)
                if key in known:
                    acks.append(_ack(b.agent_id, b.seq, True, node_acks(store.nodes.get(b.node))))
                    store.touch(b.node, item.received_s)
                    continue
                known.add(key)
                rows.append(
                    {
                        "agent_id": b.agent_id,
                        "seq": b.seq,
                        "node": b.node,
                        "received_s": item.received_s,
                        "sent_at_s": b.sent_at_s,
                        "samples": _sample_count(item),
                        "findings": len(b.findings),
                        "events": len(b.events),
                        "buffered": b.buffered,
                        "token_id": item.principal.token_id,
                    }
                )
                _apply_one(uow, item, node_updates, events)
                acks.append(_ack(b.agent_id, b.seq, False, node_acks(store.nodes[b.node])))
                fresh.append(item)
            if rows:
                s.execute(insert(IngestedBatch), rows)
            if events:
                s.execute(insert(EventRow), events)
            if node_updates:
                s.execute(update(Node), list(node_updates.values()))
    except Exception as exc:
        log_failure(log, "ingest transaction failed; reloading state from the database", exc)
        store.reload()
        raise
    n = 0
    for item in fresh:
        node = item.batch.node
        if item.arrays is not None:
            n += store.telemetry.add_groups(node, item.arrays)
        else:
            for ws in item.batch.samples:
                n += store.telemetry.add(node, ws.gpu_index, ws.t, ws.fields)
        account_energy(store, item)
    store.stats["samples"] += n
    store.stats["batches"] += len(fresh)
    store.stats["duplicates"] += len(items) - len(fresh)
    return acks


def _apply_one(
    uow: UnitOfWork,
    item: IngestItem,
    node_updates: dict[int, dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    store, s = uow.store, uow.s
    b = item.batch
    now = store.clock()
    actor = f"agent:{b.agent_id}"
    nc = store.nodes.get(b.node)
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
            rings_url=store.advertise_url,
        )
        s.add(row)
        s.flush()
        lc.register(s, row, actor=actor, reason=f"first batch from agent {b.agent_id}", now_s=now)
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
            rings_url=store.advertise_url,
            state_since_s=now,
            state_reason=row.state_reason,
        )
        store.nodes[b.node] = nc
    store.touch(b.node, item.received_s)
    store.dirty(b.node)
    if b.devices is not None:
        for d in b.devices:
            _upsert_gpu(store, s, nc, d.index, d.uuid, d.info, now)
    if b.host is not None:  # sent with the devices: rare, so its own statement
        s.execute(update(Node).where(Node.id == nc.id).values(host=b.host.model_dump()))
    for index, uuid in _block_gpus(item):
        if index not in nc.gpus:
            _upsert_gpu(store, s, nc, index, uuid, {"uuid": uuid}, now)
    changed = (
        b.health != nc.health
        or b.agent_id != nc.agent_id
        or b.heartbeat_interval_s != nc.interval_s
        or item.received_s - nc.persisted_seen_s >= store.seen_persist_s
        or nc.rings_url != store.advertise_url
    )
    nc.health, nc.agent_id, nc.interval_s = b.health, b.agent_id, b.heartbeat_interval_s
    if changed:
        nc.persisted_seen_s = item.received_s
        # this replica's rings hold the node's newest samples now: say so with the heartbeat
        # (at most every second with replicas), so others forward its raw series reads here
        nc.rings_url = store.advertise_url
        node_updates[nc.id] = {
            "id": nc.id,
            "health": b.health,
            "agent_id": b.agent_id,
            "heartbeat_interval_s": b.heartbeat_interval_s,
            "last_seen_s": nc.last_seen_s,
            "rings_url": store.advertise_url,
        }
    for e in b.events:
        events.append(
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
        )
    # Lifecycle from the agent's side.
    if nc.state == S.LOST:
        before = s.get(Node, nc.id)
        prev = before.state_before_lost if before is not None else None
        back = S(prev) if prev in (S.DRAINING, S.DRAINED) else S.VALIDATING
        reason = f"heartbeats resumed (agent {b.agent_id})"
        if back is not S.VALIDATING:  # still out for the reason it went out: keep saying so
            why = _reason_into(s, nc.name, back)
            reason = f"{why}; {reason}" if why else reason
        uow.move(nc, back, actor=actor, reason=reason)
    if nc.state == S.REGISTERING:
        uow.move(nc, S.VALIDATING, actor=actor, reason=f"agent reported {len(nc.gpus)} GPU(s)")
    _apply_findings(uow, nc, b.findings, now)
    uow.maybe_in_service(nc, actor)


def _reason_into(s: Session, node: str, state: S) -> str | None:
    """The reason of ``node``'s latest move into ``state`` from anything but ``lost`` (the
    drain one or more lost spells interrupted)."""
    row = s.scalars(
        select(Transition)
        .where(
            Transition.node == node,
            Transition.to_state == state.value,
            Transition.from_state != NodeState.LOST.value,
        )
        .order_by(Transition.id.desc())
        .limit(1)
    ).first()
    return row.reason if row is not None else None


def _upsert_gpu(
    store: ControlStore,
    s: Session,
    nc: NodeCache,
    index: int,
    uuid: str,
    info: dict[str, Any],
    now: float,
) -> None:
    digest = info_digest(info)
    cur = nc.gpus.get(index)
    if cur is not None and cur.digest == digest:
        # reported again unchanged (a restarted agent's first batch): only when it was said,
        # so a campaign can tell a report from after a node's update from one before it
        s.execute(update(Gpu).where(Gpu.id == cur.id).values(updated_s=now))
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
    uow: UnitOfWork, nc: NodeCache, snapshot: list[WireFinding], now: float
) -> None:
    s = uow.s
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
                _remediate(uow, nc, wf)
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
            _remediate(uow, nc, wf)


def _remediate(uow: UnitOfWork, nc: NodeCache, wf: WireFinding) -> None:
    if nc.state not in (S.IN_SERVICE, S.VALIDATING):
        return
    store, s = uow.store, uow.s
    uow.update_breaker()
    d = decide(store.policy, store.breaker, code=wf.code, severity=wf.severity, message=wf.message)
    now = store.clock()
    if d.outcome == "drain":
        uow.move(nc, S.DRAINING, actor="remediation", reason=d.reason)
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
