"""Response and request bodies of the REST API (`/api/v1`), as pydantic models: what the
OpenAPI document describes and what the dashboard reads."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.wire import Ack
from gpufleet.wire.validation import ValidationPost
from gpufleet.wire.views import FindingOut as FindingOut
from gpufleet.wire.views import NodeOut as NodeOut


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    return v


Text = Annotated[str, AfterValidator(_no_nul)]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class GpuLatest(_Out):
    """A GPU with its newest sample (``metrics`` maps field name to value or null)."""

    index: int
    uuid: str
    model: str | None
    power_limit_w: float | None
    health: int
    t: float | None
    metrics: dict[str, float | None]


class NodeWithGpus(NodeOut):
    gpu_latest: list[GpuLatest]


class NodeList(_Out):
    total: int
    nodes: list[NodeWithGpus]


class GpuOut(_Out):
    node: str
    index: int
    uuid: str
    name: str
    model: str | None
    info: dict[str, Any]


class EventOut(_Out):
    id: int
    at_s: float
    node: str | None
    kind: str
    severity: int
    message: str
    data: dict[str, Any]


class TransitionOut(_Out):
    id: int
    node: str
    from_state: str | None
    to_state: str
    actor: str
    reason: str
    at_s: float


class AuditOut(_Out):
    id: int
    at_s: float
    actor: str
    role: str
    action: str
    target: str
    outcome: str
    detail: dict[str, Any]


class ValidationOut(_Out):
    id: int
    node: str
    verdict: str
    received_s: float
    actor: str


class NodeDetail(_Out):
    node: NodeWithGpus
    devices: list[GpuOut]
    findings: list[FindingOut]
    transitions: list[TransitionOut]
    validations: list[ValidationOut]
    host: dict[str, Any] | None = None  # CPUs and memory as the agent reported them


class RemediationState(_Out):
    circuit_open: bool
    circuit_message: str
    circuit_since_s: float | None
    dry_run: bool
    max_out_fraction: float
    min_out_nodes: int = 1
    out: int
    total: int


class IngestStats(_Out):
    batches: int
    duplicates: int
    samples: int
    pending: int


class FleetSummary(_Out):
    """Everything the overview needs, from memory: cheap enough to poll every 2 s."""

    generation: int
    now_s: float
    version: str
    nodes: int
    gpus: int
    by_state: dict[str, int]
    by_health: dict[str, int]
    by_model: dict[str, int]
    racks: list[str]
    findings_active: int
    remediation: RemediationState
    ingest: IngestStats


class HeatmapGroup(_Out):
    """The nodes of one rack or model folded into one heatmap tile: counts by lifecycle state
    and health (a lost node counts as unknown), and the metric over its GPUs with data."""

    key: str | None  # the rack or model; None: nodes without one
    nodes: int
    gpus: int
    by_state: dict[str, int]
    by_health: dict[str, int]
    worst_health: int  # fail, else unknown, else warn, else ok (as health codes 2, 3, 1, 0)
    out: int  # nodes out of service (draining, drained, repair, lost, failed)
    cordoned: int
    min: float | None
    mean: float | None
    max: float | None
    no_data: int  # GPU cells without a current value


class Heatmap(_Out):
    """Nodes x GPUs of one metric; ``values[i][j]`` is GPU j of ``nodes[i]`` (null: no data)."""

    metric: str
    generation: int
    nodes: list[str]
    states: list[str]
    health: list[int]
    racks: list[str | None]
    models: list[str | None]
    values: list[list[float | None]]
    cordoned: list[bool] = []
    # with ``group_by`` (rack or model) and more GPU cells than ``max_cells``: the groups, and
    # the rows above are only the nodes of the groups asked for with ``expand``
    group_by: str | None = None
    groups: list[HeatmapGroup] | None = None


class Series(_Out):
    """Samples of one GPU, oldest first; rollups carry per-minute mean and min/max."""

    node: str
    gpu: int
    resolution: str
    t: list[float]
    fields: dict[str, list[float | None]]
    min: dict[str, list[float | None]] | None = None
    max: dict[str, list[float | None]] | None = None
    power_limit_w: float | None = None
    # where the samples came from: "memory" (the answering replica's rings, or for minutes the
    # shared rollup table), "peer" (forwarded to the replica holding the node's rings, named
    # in ``served_by``) or "prometheus"; ``partial``: recent raw samples held by another
    # replica could not be read, ``note`` says why (gpufleet.control.series.forward)
    source: str | None = None
    served_by: str | None = None
    partial: bool = False
    note: str | None = None


class ActionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: Text = Field("", max_length=1000)


_KEEP_OR_CLEAR = {
    "rack": 'leave "rack" out to keep the rack',
    "tenant": 'leave "tenant" out to keep it, or send "" to take the node out of its tenant',
    "labels": 'leave "labels" out to keep them, or send {} to remove them all',
}


def _not_nullable(schema: dict[str, Any]) -> None:
    """The schema of a body whose optional fields may be left out but never null."""
    for prop in schema.get("properties", {}).values():
        kinds = prop.pop("anyOf", None)
        if kinds is not None:
            prop.update(next(k for k in kinds if k.get("type") != "null"))
        prop.pop("default", None)


class NodePatch(BaseModel):
    """The attributes a PATCH of a node sets; a field left out is kept. An explicit null is
    refused (it once answered 200 and changed nothing, which reads as "unset")."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_not_nullable)
    rack: Text | None = Field(None, max_length=128)
    tenant: Text | None = Field(None, max_length=64)
    labels: (
        dict[Annotated[Text, Field(max_length=64)], Annotated[Text, Field(max_length=256)]] | None
    ) = None

    @field_validator("rack", "tenant", "labels", mode="before")
    @classmethod
    def _no_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            raise ValueError(f"null is not a value: {_KEEP_OR_CLEAR[str(info.field_name)]}")
        return value


ValidationIn = ValidationPost


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str = Field(pattern="^(admin|operator|viewer|agent)$")
    name: Text = Field("", max_length=128)
    tenant: Text | None = Field(None, max_length=64)
    node: Text | None = Field(None, max_length=253)


class TokenOut(_Out):
    id: int
    name: str
    prefix: str
    role: str
    tenant: str | None
    node: str | None
    created_s: float
    revoked_s: float | None
    owner: str | None = None  # "up": made by `gpufleet up`, revoked at its next start


class TokenCreated(_Out):
    id: int
    token: str


class WhoAmI(_Out):
    name: str
    role: str
    tenant: str | None
    node: str | None


class Problem(_Out):
    """An error: a sentence, or (request validation) FastAPI's list of problems."""

    detail: str | list[dict[str, Any]]


PolicyOut = RemediationPolicy


IngestAck = Ack  # what /ingest answers (the fast path writes it itself)
