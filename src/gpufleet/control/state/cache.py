"""The control plane's in-memory mirror of hot rows (nodes, their GPUs and active findings), the
immutable snapshot readers see (`Snapshot`), and the unit of ingest work (`IngestItem`).

The mutable caches (`NodeCache`, `FindingCache`) belong to the writer thread alone
(`gpufleet.control.state.writer`); after each commit it publishes a new `Snapshot` of frozen
`NodeView`s, rebuilding only the nodes that commit touched, and readers (API handlers, the
stream, the scheduler worker) only ever see whole snapshots."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpufleet.control.state.auth import Principal
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.control.state.rings import SampleGroup
from gpufleet.wire import Batch, WireAck


@dataclass
class FindingCache:
    """What the hot path needs to know about an active finding. ``ack``: an acknowledged sticky
    finding's acknowledgement, sent to the node's agent while it still reports the finding."""

    id: int
    severity: int
    sticky: bool
    present: bool = True
    acknowledged: bool = False
    ack: WireAck | None = None


@dataclass(frozen=True)
class GpuCache:
    """A GPU as the hot paths see it (``digest`` of its device info: unchanged info is not
    rewritten)."""

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
    rings_url: str | None = None  # as this replica last read or wrote it (nodes.rings_url)
    state_since_s: float = 0.0
    state_reason: str = ""
    gpus: dict[int, GpuCache] = field(default_factory=dict)
    findings: dict[tuple[str, str], FindingCache] = field(default_factory=dict)

    @property
    def model(self) -> str | None:
        return next((g.model for g in self.gpus.values() if g.model), None)


@dataclass(frozen=True)
class FindingView:
    """An active finding as readers see it."""

    id: int
    severity: int
    sticky: bool
    acknowledged: bool


@dataclass(frozen=True)
class NodeView:
    """A node as readers see it: a frozen copy of its `NodeCache` at one commit."""

    id: int
    name: str
    state: str
    health: int
    cordoned: bool
    tenant: str | None
    rack: str | None
    agent_id: str | None
    interval_s: float
    last_seen_s: float | None
    state_since_s: float
    state_reason: str
    gpus: Mapping[int, GpuCache]
    findings: Mapping[tuple[str, str], FindingView]
    model: str | None

    @classmethod
    def of(cls, nc: NodeCache) -> NodeView:
        return cls(
            id=nc.id,
            name=nc.name,
            state=nc.state,
            health=nc.health,
            cordoned=nc.cordoned,
            tenant=nc.tenant,
            rack=nc.rack,
            agent_id=nc.agent_id,
            interval_s=nc.interval_s,
            last_seen_s=nc.last_seen_s,
            state_since_s=nc.state_since_s,
            state_reason=nc.state_reason,
            gpus=MappingProxyType(dict(nc.gpus)),
            findings=MappingProxyType(
                {
                    k: FindingView(f.id, f.severity, f.sticky, f.acknowledged)
                    for k, f in nc.findings.items()
                }
            ),
            model=nc.model,
        )


@dataclass(frozen=True)
class BreakerView:
    """The remediation circuit breaker at one commit."""

    open: bool = False
    message: str = ""
    since_s: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything readers need of the control plane's state at one commit (never mutated:
    the writer swaps in a new one). ``generation`` changes whenever anything changed."""

    generation: int
    nodes: Mapping[str, NodeView]
    policy: RemediationPolicy  # the writer replaces the policy object, never edits it
    breaker: BreakerView
    out: int
    total: int
    stats: Mapping[str, int]


EMPTY_SNAPSHOT = Snapshot(
    0, MappingProxyType({}), RemediationPolicy(), BreakerView(), 0, 0, MappingProxyType({})
)


@dataclass(frozen=True)
class IngestItem:
    """A parsed batch waiting for its group commit."""

    batch: Batch
    principal: Principal
    received_s: float
    arrays: list[SampleGroup] | None = None  # samples as arrays (`ingest.parse_batch`)
    # set when ``batch.samples`` was left out once ``arrays`` held them (`ingest.queue_item`):
    # the number of samples sent, and (GPU index, UUID) of the blocks' GPUs in first-seen order
    sample_count: int | None = None
    block_gpus: tuple[tuple[int, str], ...] = ()
    # energy-counter readings of the blocks (GPU index, times, mJ), set with ``sample_count``
    energy: tuple[tuple[int, list[Any], list[Any]], ...] = ()


def agent_ack(
    code: str,
    component: str,
    sticky: bool,
    who: str | None,
    at_s: float | None,
    why: str = "",
) -> WireAck | None:
    """The acknowledgement the node's agent gets for an acknowledged finding (None when the
    finding is not sticky: the agent clears those by itself, it cannot acknowledge them).
    ``why`` defaults to "acknowledged on the control plane by <who>"."""
    if not sticky or not who:
        return None
    why = why.strip() or f"acknowledged on the control plane by {who}"
    return WireAck(code=code, component=component, who=who, why=why[:1000], at_s=at_s or 0.0)


def info_digest(info: dict[str, Any]) -> str:
    """A stable fingerprint of a GPU's device info."""
    return hashlib.sha1(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()
