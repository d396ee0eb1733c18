"""What the control plane's REST API answers about nodes, findings and jobs, as the CLI, the
Python client and the dashboard read them (the one definition each; the API's OpenAPI document
is generated from these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _View(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class NodeOut(_View):
    """A node in lists: lifecycle state, health (0 ok, 1 warn, 2 fail, 3 unknown), counts."""

    name: str
    state: str
    health: int
    cordoned: bool
    rack: str | None
    model: str | None
    tenant: str | None
    gpus: int
    last_seen_s: float | None
    state_since_s: float
    state_reason: str
    findings_active: int
    findings_fail: int
    # what to show as the node's reason: "drain blocked by circuit breaker" while the breaker
    # keeps this failing node in service (no new work lands there), else ``state_reason``
    reason: str = ""


class FindingOut(_View):
    """A health finding on a node: severity 0 ok .. 2 fail, the recommended action, evidence."""

    id: int
    node: str
    code: str
    component: str
    rule: str
    severity: int
    message: str
    action: str
    evidence: dict[str, Any]
    sticky: bool
    gpu_index: int | None
    first_seen_s: float
    last_seen_s: float
    active: bool
    cleared_s: float | None
    acknowledged_by: str | None
    acknowledged_s: float | None


class JobOut(_View):
    """One job as the Jobs view lists it (``gpus``: GPUs it asks for, per node x nodes)."""

    id: str
    name: str
    tenant: str
    state: str
    nodes: list[str]
    gpus: int
    restarts: int  # restarts after the job's own non-zero exits (max_restarts)
    exit_code: int | None
    reason: str
    priority: int
    submitted_at_s: float | None
    started_at_s: float | None
    ended_at_s: float | None
    requeues: int = 0  # infrastructure requeues: node lost, fail finding, fencing
