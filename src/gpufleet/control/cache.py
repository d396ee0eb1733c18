"""The control plane's in-memory mirror of hot rows (nodes, their GPUs and active findings) and
the unit of ingest work (`IngestItem`); shared by the store and the ingest writes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from gpufleet.control.auth import Principal
from gpufleet.control.telemetry_store import SampleGroup
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


@dataclass
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
    arrays: list[SampleGroup] | None = None  # samples as arrays (`ingest.parse_batch`)


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
