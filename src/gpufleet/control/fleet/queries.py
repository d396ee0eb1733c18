"""Reads for the API: fleet summary, node lists with latest per-GPU metrics, heatmap rows, findings,
events, transitions, audit (series: `gpufleet.control.series.memory`). Node-level reads come from
the writer's newest immutable snapshot (`ControlStore.view`), never from its working cache."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select

from gpufleet import __version__
from gpufleet.control.db.models import (
    AuditEntry,
    EventRow,
    FindingRow,
    Gpu,
    Node,
    Transition,
    ValidationResultRow,
)
from gpufleet.control.state.auth import Principal
from gpufleet.control.state.lifecycle import NodeState
from gpufleet.control.state.remediation import BLOCKED_REASON, blocked_drain
from gpufleet.control.state.rings import FIELD_INDEX, FIELDS
from gpufleet.control.state.store import ControlStore, NodeView
from gpufleet.wire import views as sc

HEALTH_WORDS = {0: "ok", 1: "warn", 2: "fail", 3: "unknown"}
HEATMAP_METRICS = (*FIELDS, "health", "power_pct")


def visible(nc: NodeView, who: Principal) -> bool:
    """Tenant tokens see shared nodes (no tenant) and their own tenant's nodes."""
    return who.tenant is None or nc.tenant is None or nc.tenant == who.tenant


def _gpu_health(nc: NodeView) -> dict[int, int]:
    out: dict[int, int] = {}
    for fc_key, fc in nc.findings.items():
        _ = fc_key
        gi = _finding_gpu(nc, fc_key)
        if gi is not None:
            out[gi] = max(out.get(gi, 0), fc.severity)
    return out


def _finding_gpu(nc: NodeView, key: tuple[str, str]) -> int | None:
    component = key[1]
    for i, g in nc.gpus.items():
        if g.uuid == component:
            return i
    return None


def node_reason(store: ControlStore, nc: NodeView) -> str:
    """The node's reason as the dashboard shows it (see ``NodeOut.reason``)."""
    view = store.view
    findings = [(k[0], f.severity) for k, f in nc.findings.items()]
    if blocked_drain(view.policy, view.breaker.open, nc.state, findings):
        return BLOCKED_REASON
    return nc.state_reason


def node_out(store: ControlStore, nc: NodeView, with_gpus: bool = True) -> sc.NodeWithGpus:
    latest: list[sc.GpuLatest] = []
    if with_gpus:
        gh = _gpu_health(nc)
        lost = nc.state == NodeState.LOST
        for i in sorted(nc.gpus):
            g = nc.gpus[i]
            t, metrics = store.telemetry.latest(nc.name, i)
            latest.append(
                sc.GpuLatest(
                    index=i,
                    uuid=g.uuid,
                    model=g.model,
                    power_limit_w=g.power_limit_w,
                    health=3 if lost else gh.get(i, 0),
                    t=t,
                    metrics=metrics,
                )
            )
    return sc.NodeWithGpus(
        name=nc.name,
        state=nc.state,
        health=nc.health,
        cordoned=nc.cordoned,
        rack=nc.rack,
        model=nc.model,
        tenant=nc.tenant,
        gpus=len(nc.gpus),
        last_seen_s=nc.last_seen_s,
        state_since_s=nc.state_since_s,
        state_reason=nc.state_reason,
        reason=node_reason(store, nc),
        findings_active=len(nc.findings),
        findings_fail=sum(1 for f in nc.findings.values() if f.severity >= 2),
        gpu_latest=latest,
    )


def summary(store: ControlStore, who: Principal, pending: int = 0) -> sc.FleetSummary:
    view = store.view
    # one pass (10,000 nodes: the stream builds this every second for every open page)
    by_state: Counter[str] = Counter()
    health: Counter[int] = Counter()
    by_model: Counter[str] = Counter()
    racks: set[str] = set()
    count = gpus = findings = 0
    lost = NodeState.LOST.value
    for n in view.nodes.values():
        if not visible(n, who):
            continue
        count += 1
        gpus += len(n.gpus)
        findings += len(n.findings)
        by_state[n.state] += 1
        # a lost node's last reported health is history: it counts as unknown (as in the
        # heatmap and the GPU rows)
        health[3 if n.state == lost else n.health] += 1
        by_model[n.model or "unknown"] += 1
        if n.rack:
            racks.add(n.rack)
    b, policy = view.breaker, view.policy
    return sc.FleetSummary(
        generation=view.generation,
        now_s=store.clock(),
        version=__version__,
        nodes=count,
        gpus=gpus,
        by_state={s.value: by_state.get(s.value, 0) for s in NodeState},
        by_health={w: health.get(k, 0) for k, w in HEALTH_WORDS.items()},
        by_model=dict(by_model),
        racks=sorted(racks),
        findings_active=findings,
        remediation=sc.RemediationState(
            circuit_open=b.open,
            circuit_message=b.message,
            circuit_since_s=b.since_s,
            dry_run=policy.dry_run,
            max_out_fraction=policy.max_out_fraction,
            min_out_nodes=policy.min_out_nodes,
            out=view.out,
            total=view.total,
        ),
        ingest=sc.IngestStats(
            batches=view.stats["batches"],
            duplicates=view.stats["duplicates"],
            samples=view.stats["samples"],
            pending=pending,
        ),
    )


def filtered_nodes(
    store: ControlStore,
    who: Principal,
    *,
    state: str | None = None,
    rack: str | None = None,
    model: str | None = None,
    health: int | None = None,
) -> list[NodeView]:
    out = []
    for nc in sorted(store.view.nodes.values(), key=lambda n: n.name):
        if not visible(nc, who):
            continue
        if state and nc.state != state:
            continue
        if rack and nc.rack != rack:
            continue
        if model and nc.model != model:
            continue
        if health is not None and nc.health != health:
            continue
        out.append(nc)
    return out


# A GPU whose newest sample is this far behind its node's newest stopped answering (the node
# page's "no data" badge uses the same figure): the heatmap shows it as no data, not its last value.
STALE_GPU_S = 10.0


def heatmap_row(store: ControlStore, nc: NodeView, metric: str) -> list[float | None]:
    """One node's heatmap cells: ``metric`` of GPUs 0..max index (None: no data)."""
    width = (max(nc.gpus) + 1) if nc.gpus else 0
    if metric == "health":
        gh = _gpu_health(nc)
        lost = nc.state == NodeState.LOST
        return [3.0 if lost else float(gh.get(i, 0)) for i in range(width)]
    if metric == "power_pct":
        watts = store.telemetry.latest_field(nc.name, width, "power_w", stale_s=STALE_GPU_S)
        row: list[float | None] = []
        for i, w in enumerate(watts):
            lim = nc.gpus[i].power_limit_w if i in nc.gpus else None
            row.append(100.0 * w / lim if (w is not None and lim) else None)
        return row
    return store.telemetry.latest_field(nc.name, width, metric, stale_s=STALE_GPU_S)


def heatmap(
    store: ControlStore,
    nodes: list[NodeView],
    metric: str,
    *,
    values: list[list[float | None]] | None = None,
    group_by: str | None = None,
    groups: list[sc.HeatmapGroup] | None = None,
) -> sc.Heatmap:
    """Rows of ``nodes`` (``values``: computed already, one row per node); with ``groups``
    (`gpufleet.control.fleet.views`), the fleet's groups too, and ``nodes`` are only those of
    the expanded groups."""
    return sc.Heatmap(
        metric=metric,
        generation=store.view.generation,
        nodes=[n.name for n in nodes],
        states=[n.state for n in nodes],
        health=[n.health for n in nodes],
        racks=[n.rack for n in nodes],
        models=[n.model for n in nodes],
        cordoned=[n.cordoned for n in nodes],
        values=values if values is not None else [heatmap_row(store, nc, metric) for nc in nodes],
        group_by=group_by,
        groups=groups,
    )


def node_detail(store: ControlStore, nc: NodeView, history: int = 100) -> sc.NodeDetail:
    with store.sessions() as s:
        devices = [
            sc.GpuOut(
                node=nc.name, index=g.index, uuid=g.uuid, name=g.name, model=g.model, info=g.info
            )
            for g in s.scalars(select(Gpu).where(Gpu.node_id == nc.id).order_by(Gpu.index))
        ]
        findings = [
            sc.FindingOut.model_validate(f)
            for f in s.scalars(
                select(FindingRow)
                .where(FindingRow.node == nc.name, FindingRow.active.is_(True))
                .order_by(FindingRow.severity.desc(), FindingRow.id)
            )
        ]
        transitions = [
            sc.TransitionOut.model_validate(t)
            for t in s.scalars(
                select(Transition)
                .where(Transition.node == nc.name)
                .order_by(Transition.id.desc())
                .limit(history)
            )
        ]
        validations = [
            sc.ValidationOut.model_validate(v)
            for v in s.scalars(
                select(ValidationResultRow)
                .where(ValidationResultRow.node == nc.name)
                .order_by(ValidationResultRow.id.desc())
                .limit(20)
            )
        ]
        host = s.scalar(select(Node.host).where(Node.id == nc.id))
    return sc.NodeDetail(
        node=node_out(store, nc),
        devices=devices,
        findings=findings,
        transitions=transitions,
        validations=validations,
        host=host,
    )


def findings(
    store: ControlStore,
    who: Principal,
    *,
    node: str | None,
    active: bool | None,
    severity: int | None,
    limit: int,
    before_id: int | None,
) -> list[sc.FindingOut]:
    q = select(FindingRow)
    if node:
        q = q.where(FindingRow.node == node)
    if active is not None:
        q = q.where(FindingRow.active.is_(active))
    if severity is not None:
        q = q.where(FindingRow.severity >= severity)
    if before_id is not None:
        q = q.where(FindingRow.id < before_id)
    with store.sessions() as s:
        rows = list(s.scalars(q.order_by(FindingRow.id.desc()).limit(limit)))
    return [sc.FindingOut.model_validate(r) for r in rows if _visible_name(store, r.node, who)]


def _visible_name(store: ControlStore, node: str | None, who: Principal) -> bool:
    if node is None or who.tenant is None:
        return True
    nc = store.view.nodes.get(node)
    return nc is None or visible(nc, who)


def events(
    store: ControlStore,
    who: Principal,
    *,
    node: str | None,
    kind: str | None,
    since_id: int | None,
    before_id: int | None,
    limit: int,
) -> list[sc.EventOut]:
    q = select(EventRow)
    if node:
        q = q.where(EventRow.node == node)
    if kind:
        q = q.where(EventRow.kind == kind)
    if since_id is not None:
        q = q.where(EventRow.id > since_id)
    if before_id is not None:
        q = q.where(EventRow.id < before_id)
    with store.sessions() as s:
        rows = list(s.scalars(q.order_by(EventRow.id.desc()).limit(limit)))
    return [sc.EventOut.model_validate(r) for r in rows if _visible_name(store, r.node, who)]


def transitions(store: ControlStore, node: str | None, limit: int) -> list[sc.TransitionOut]:
    q = select(Transition)
    if node:
        q = q.where(Transition.node == node)
    with store.sessions() as s:
        rows = list(s.scalars(q.order_by(Transition.id.desc()).limit(limit)))
    return [sc.TransitionOut.model_validate(r) for r in rows]


def finding_node(store: ControlStore, finding_id: int) -> str | None:
    """The node a finding belongs to (None: no such finding)."""
    with store.sessions() as s:
        row = s.get(FindingRow, finding_id)
        return row.node if row is not None else None


def audit(
    store: ControlStore, who: Principal, limit: int, before_id: int | None
) -> list[sc.AuditOut]:
    """Newest first; a tenant token reads only the rows its tenant's tokens wrote."""
    q = select(AuditEntry)
    if who.tenant is not None:
        q = q.where(AuditEntry.tenant == who.tenant)
    if before_id is not None:
        q = q.where(AuditEntry.id < before_id)
    with store.sessions() as s:
        rows = list(s.scalars(q.order_by(AuditEntry.id.desc()).limit(limit)))
    return [sc.AuditOut.model_validate(r) for r in rows]


def gpus(
    store: ControlStore,
    who: Principal,
    node: str | None,
    model: str | None,
    limit: int,
    offset: int,
) -> list[sc.GpuOut]:
    q = select(Gpu)
    if model:
        q = q.where(Gpu.model == model)
    view = store.view
    if node:
        nc = view.nodes.get(node)
        if nc is None or not visible(nc, who):
            return []
        q = q.where(Gpu.node_id == nc.id)
    names = {n.id: n.name for n in view.nodes.values() if visible(n, who)}
    with store.sessions() as s:
        rows = list(s.scalars(q.order_by(Gpu.node_id, Gpu.index).offset(offset).limit(limit)))
    return [
        sc.GpuOut(
            node=names[g.node_id],
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            model=g.model,
            info=g.info,
        )
        for g in rows
        if g.node_id in names
    ]


__all__ = ["FIELD_INDEX", "HEATMAP_METRICS"]
