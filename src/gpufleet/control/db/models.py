"""The control plane's tables (SQLAlchemy 2 ORM): sites, racks, nodes, GPUs, ingested batches,
per-minute telemetry rollups, findings, events, lifecycle transitions, audit log, API tokens,
tenants, validation results and the controller's own key/value state.

Times are float seconds since the epoch (``*_s``), the same unit as the wire schema, so SQLite
and PostgreSQL store them identically and no timezone conversion is ever needed.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# BigInteger primary keys autoincrement on SQLite only as INTEGER; this variant keeps both happy.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Declarative base of every control-plane table."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Tenant(Base):
    """A tenant: tokens and nodes may belong to one; tenant tokens see only their own."""

    __tablename__ = "tenants"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_s: Mapped[float] = mapped_column(Float)


class Site(Base):
    """A data-center site."""

    __tablename__ = "sites"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)


class Rack(Base):
    """A rack inside a site."""

    __tablename__ = "racks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    site_id: Mapped[int | None] = mapped_column(ForeignKey("sites.id"), nullable=True)


class Node(Base):
    """A server that runs (or ran) an agent; ``state`` is its lifecycle state."""

    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    rack_id: Mapped[int | None] = mapped_column(ForeignKey("racks.id"), nullable=True)
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    state_before_lost: Mapped[str | None] = mapped_column(String(16), nullable=True)
    state_since_s: Mapped[float] = mapped_column(Float)
    state_reason: Mapped[str] = mapped_column(Text, default="")
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    health: Mapped[int] = mapped_column(Integer, default=3)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    heartbeat_interval_s: Mapped[float] = mapped_column(Float, default=2.0)
    last_seen_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    registered_s: Mapped[float] = mapped_column(Float)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # CPUs and memory as the agent read them (`gpufleet.wire.WireHost`); None until reported
    host: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # the ``--advertise-url`` of the replica that last ingested the node, so holds its recent
    # raw samples in memory (revision 0010; written with the throttled heartbeat); None: none
    # advertised (`gpufleet.control.series.forward`)
    rings_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)


class Gpu(Base):
    """A GPU as its node's agent described it (``info`` is a DeviceInfo mapping)."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index", name="uq_gpus_node_index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96))
    name: Mapped[str] = mapped_column(String(128), default="")
    model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_s: Mapped[float] = mapped_column(Float)


class IngestedBatch(Base):
    """One acknowledged batch: the (node, agent_id, seq) key makes ingest idempotent. The node
    is part of the key, so a batch for one node can never count as a duplicate of another
    node's (an agent id is only a label the agent picks)."""

    __tablename__ = "ingested_batches"
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    received_s: Mapped[float] = mapped_column(Float, index=True)
    sent_at_s: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    findings: Mapped[int] = mapped_column(Integer, default=0)
    events: Mapped[int] = mapped_column(Integer, default=0)
    buffered: Mapped[bool] = mapped_column(Boolean, default=False)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Rollup(Base):
    """Per-minute statistics of one GPU: ``stats[field] = [count, min, mean, max]``."""

    __tablename__ = "rollups"
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    minute_s: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    samples: Mapped[int] = mapped_column(Integer)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)


Index("ix_rollups_minute", Rollup.minute_s)


class FindingRow(Base):
    """A finding reported by a node's agent; ``active`` until it clears or is acknowledged."""

    __tablename__ = "findings"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253), index=True)
    code: Mapped[str] = mapped_column(String(64))
    component: Mapped[str] = mapped_column(String(96))
    rule: Mapped[str] = mapped_column(String(64))
    severity: Mapped[int] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(String(32), default="none")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    sticky: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    first_seen_s: Mapped[float] = mapped_column(Float)
    last_seen_s: Mapped[float] = mapped_column(Float)
    active: Mapped[bool] = mapped_column(Boolean, default=True, index=True)
    cleared_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    acknowledged_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    acknowledged_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class EventRow(Base):
    """Something that happened: a GPU event from an agent, or a control-plane event."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at_s: Mapped[float] = mapped_column(Float, index=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True, index=True)
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Transition(Base):
    """One lifecycle transition of one node, with who, why and when."""

    __tablename__ = "transitions"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253), index=True)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    at_s: Mapped[float] = mapped_column(Float)


class AuditEntry(Base):
    """One write through the API or the CLI: who did what to what, and the outcome."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at_s: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(300), default="")
    outcome: Mapped[str] = mapped_column(String(16), default="ok")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # the acting token's tenant (None: a global token); a tenant token reads only its own rows
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)


class ApiToken(Base):
    """An API token: only its SHA-256 is stored; ``prefix`` identifies it on screen."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    created_s: Mapped[float] = mapped_column(Float)
    revoked_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # what made it, when a program owns it ("up": `gpufleet up` revokes its own at each start)
    owner: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ValidationResultRow(Base):
    """A validation result posted for a node (``gpufleet validate`` output, minimal shape)."""

    __tablename__ = "validation_results"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253), index=True)
    verdict: Mapped[str] = mapped_column(String(8))
    received_s: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(128))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ControllerState(Base):
    """The controller's own key/value state (policy overrides, last-alive mark)."""

    __tablename__ = "controller_state"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class LeaderLease(Base):
    """The one row of the leader election (issue 18, `gpufleet.control.ha.leader`): who leads
    (``holder``), until when (``expires_s``, the database's clock), and the fencing token
    (``epoch``, one more at every change of holder)."""

    __tablename__ = "leader_lease"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_s: Mapped[float] = mapped_column(Float)
    acquired_s: Mapped[float] = mapped_column(Float)


class MaintCampaign(Base):
    """A maintenance campaign (issue 15): its spec (baseline, limits, windows, update command,
    timeouts), its state (running, paused, halted, aborted, done) and its failure count."""

    __tablename__ = "maint_campaigns"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_s: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))
    updated_s: Mapped[float] = mapped_column(Float)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")


class MaintNode(Base):
    """One node of a campaign: its place in the order, failure domain, current step and
    the update's outcome as its agent reported it."""

    __tablename__ = "maint_nodes"
    campaign_id: Mapped[int] = mapped_column(
        ForeignKey("maint_campaigns.id", ondelete="CASCADE"), primary_key=True
    )
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    ord: Mapped[int] = mapped_column(Integer)
    domain: Mapped[str] = mapped_column(String(253))
    gpus: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(16), index=True)
    step_since_s: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class MaintStep(Base):
    """One step a campaign took for one node; (campaign, node, step) is unique, so a step
    replayed after a controller restart is never taken twice."""

    __tablename__ = "maint_steps"
    __table_args__ = (UniqueConstraint("campaign_id", "node", "step", name="uq_maint_steps_key"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    campaign_id: Mapped[int] = mapped_column(Integer, index=True)
    node: Mapped[str] = mapped_column(String(253))
    step: Mapped[str] = mapped_column(String(16))
    at_s: Mapped[float] = mapped_column(Float)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class PowerOrder(Base):
    """A fleet-wide power order (issue 16): who asked what (limit or per-GPU plan, the selector
    it was resolved from), its state (active, restoring, restored) and when policy reverts it."""

    __tablename__ = "power_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    tenant: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_s: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))
    revert_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    restore_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    restore_by: Mapped[str | None] = mapped_column(String(128), nullable=True)


class PowerOrderNode(Base):
    """One node of a power order: the limits it gets and each GPU's outcome as its agent
    reported it, for the apply and (later) the restore. (order, node) is the order's key."""

    __tablename__ = "power_order_nodes"
    order_id: Mapped[int] = mapped_column(
        ForeignKey("power_orders.id", ondelete="CASCADE"), primary_key=True
    )
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    applied: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    applied_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    restored: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    restored_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class EnergyMinute(Base):
    """Energy of one GPU in one minute (issue 16), additive parts so late or partial windows
    merge by addition: joules of counter windows and the seconds they covered (``fallback_j``:
    those of them taken from power samples, where the counter was reset), joules integrated
    from every power sample and the seconds they covered (fills time no window covers), and
    the share of the latter while the GPU idled in service.
    ``tenant`` and ``model`` are the node's tenant and the GPU's model when it was measured."""

    __tablename__ = "energy_minutes"
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    minute_s: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    window_j: Mapped[float] = mapped_column(Float, default=0.0)
    window_s: Mapped[float] = mapped_column(Float, default=0.0)
    fallback_j: Mapped[float] = mapped_column(Float, default=0.0)
    power_j: Mapped[float] = mapped_column(Float, default=0.0)
    power_s: Mapped[float] = mapped_column(Float, default=0.0)
    idle_j: Mapped[float] = mapped_column(Float, default=0.0)
    idle_s: Mapped[float] = mapped_column(Float, default=0.0)


Index("ix_energy_minutes_minute", EnergyMinute.minute_s)


class EnergyCounter(Base):
    """The newest energy-counter reading of one GPU that the stored minutes account for: after
    a restart the next reading's window starts here, so the counter covers the gap."""

    __tablename__ = "energy_counters"
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    t_s: Mapped[float] = mapped_column(Float)
    # millijoules as float64: NVML's counter is 64-bit unsigned, the wire carries JSON numbers
    counter_mj: Mapped[float] = mapped_column(Float)


class JobProgress(Base):
    """A job's own progress as it reported it (issue 31): the work done so far (a cumulative
    count in its own ``unit``: samples, steps, tokens...) at ``t_s``. Two readings give the
    job's rate over a window, the throughput a power order's slowdown is measured by
    (`gpufleet.control.energy.savings`). ``tenant`` is the job's tenant when reported."""

    __tablename__ = "job_progress"
    job: Mapped[str] = mapped_column(String(64), primary_key=True)
    t_s: Mapped[float] = mapped_column(Float, primary_key=True)
    done: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str | None] = mapped_column(String(128), nullable=True)


Index("ix_job_progress_t", JobProgress.t_s)


class NotificationOutbox(Base):
    """One notification for one receiver, durable (issue 29, `gpufleet.control.notify.outbox`):
    written in the transaction of the event row that causes it, then ``pending`` until a
    delivery lane sends it (``delivered``) or gives up (``dead``: attempts spent, too old, or
    refused for good). ``notification_id`` is the id the receiver sees (``X-Gpufleet-Id``);
    ``claimed_by``/``claimed_until_s``: the controller sending it now (one replica at a time);
    ``last_error`` is a short reason (``HTTP 500``, ``ConnectError``), never a URL or header."""

    __tablename__ = "notification_outbox"
    __table_args__ = (
        UniqueConstraint("notification_id", "receiver", name="uq_notification_outbox_key"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    notification_id: Mapped[str] = mapped_column(String(96))
    receiver: Mapped[str] = mapped_column(String(200))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(12))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_s: Mapped[float] = mapped_column(Float)
    claimed_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    claimed_until_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_attempt_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_s: Mapped[float] = mapped_column(Float)
    done_s: Mapped[float | None] = mapped_column(Float, nullable=True)


Index(
    "ix_notification_outbox_due",
    NotificationOutbox.receiver,
    NotificationOutbox.state,
    NotificationOutbox.next_attempt_s,
)
Index("ix_notification_outbox_created", NotificationOutbox.created_s)
