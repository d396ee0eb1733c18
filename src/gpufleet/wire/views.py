"""Every body of the control plane's REST API (`/api/v1`), requests and responses, as pydantic
models: what the OpenAPI document describes (it is generated from these), what the dashboard
reads, and what the CLI and the Python client (`gpufleet.client.Client`) parse, the one
definition each.

The one body defined elsewhere is the remediation policy (``GET``/``PUT /policy``): it is also
the controller's ``--policy`` file and holds the maintenance policy, so it lives with them
(`gpufleet.control.state.remediation.RemediationPolicy`); the jobs API takes the submission as
the agents' wire carries it (`gpufleet.wire.jobs.JobSubmit`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufleet.wire.batch import Ack
from gpufleet.wire.power import MAX_POWER_W
from gpufleet.wire.validation import ValidationPost


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


class JobList(BaseModel):
    jobs: list[JobOut]


class AttemptOut(BaseModel):
    """One placement of the job: where, when, how it ended."""

    generation: int
    nodes: list[str]
    started_at_s: float | None
    ended_at_s: float | None
    outcome: str


class JobDetail(JobOut):
    """A job with its spec and attempts."""

    command: list[str]
    image: str | None
    gpus_per_node: int
    node_count: int
    gpu_indexes: list[int]
    gpu_model: str | None
    max_restarts: int
    max_requeues: int
    checkpoint_dir: str | None
    attempts: list[AttemptOut]
    # kWh, cost, CO2 of its GPUs while it held them (`gpufleet.control.energy.query`); None
    # while nothing is known
    energy: dict[str, Any] | None = None
    # the newest copy's log file, read from a local scheduler state directory (``gpufleet jobs
    # show`` without ``--controller``); None from a controller (``GET /jobs/{id}/logs``)
    log: str | None = None


class LogsOut(BaseModel):
    job: str
    text: str


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    return v


Text = Annotated[str, AfterValidator(_no_nul)]


class GpuLatest(_View):
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


class NodeList(_View):
    total: int
    nodes: list[NodeWithGpus]


class GpuOut(_View):
    node: str
    index: int
    uuid: str
    name: str
    model: str | None
    info: dict[str, Any]


class EventOut(_View):
    id: int
    at_s: float
    node: str | None
    kind: str
    severity: int
    message: str
    data: dict[str, Any]


class TransitionOut(_View):
    id: int
    node: str
    from_state: str | None
    to_state: str
    actor: str
    reason: str
    at_s: float


class AuditOut(_View):
    id: int
    at_s: float
    actor: str
    role: str
    action: str
    target: str
    outcome: str
    detail: dict[str, Any]


class ValidationOut(_View):
    id: int
    node: str
    verdict: str
    received_s: float
    actor: str


class NodeDetail(_View):
    node: NodeWithGpus
    devices: list[GpuOut]
    findings: list[FindingOut]
    transitions: list[TransitionOut]
    validations: list[ValidationOut]
    host: dict[str, Any] | None = None  # CPUs and memory as the agent reported them


class RemediationState(_View):
    circuit_open: bool
    circuit_message: str
    circuit_since_s: float | None
    dry_run: bool
    max_out_fraction: float
    min_out_nodes: int = 1
    out: int
    total: int


class IngestStats(_View):
    batches: int
    duplicates: int
    samples: int
    pending: int


class FleetSummary(_View):
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


class HeatmapGroup(_View):
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


class Heatmap(_View):
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


class Series(_View):
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


class TokenOut(_View):
    id: int
    name: str
    prefix: str
    role: str
    tenant: str | None
    node: str | None
    created_s: float
    revoked_s: float | None
    owner: str | None = None  # "up": made by `gpufleet up`, revoked at its next start


class TokenCreated(_View):
    id: int
    token: str


class Health(_View):
    """``GET /health`` (no token): liveness, the version, and whether this replica leads."""

    status: str
    version: str
    role: str


class WhoAmI(_View):
    name: str
    role: str
    tenant: str | None
    node: str | None


class Problem(_View):
    """An error: a sentence, or (request validation) FastAPI's list of problems."""

    detail: str | list[dict[str, Any]]


IngestAck = Ack  # what /ingest answers (the fast path writes it itself)


# -- power orders (issue 16): the body of ``POST /api/v1/power/orders`` ----------------------
# strict: a JSON true is not 1 W (it was accepted and refused later by every GPU)
Watts = Annotated[float, Field(gt=0, le=MAX_POWER_W, strict=True)]
Name = Annotated[str, Field(min_length=1, max_length=253)]
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
MAX_REVERT_S = 90 * 86400.0


class PowerOrderSpec(BaseModel):
    """A fleet-wide power order: what to set where, and when policy puts it back.

    Either one ``limit_w`` for the selected nodes' GPUs (``gpus``, default all) with a selector
    (``tenant``, ``partition``, ``labels``, ``nodes``: every one given must match; at least one
    is required, so no order reaches the whole fleet by accident), or a per-node, per-GPU plan
    (``per_node``, what ``power budget --accept`` sends) and no selector. ``partition`` is the
    node label ``partition``."""

    model_config = ConfigDict(extra="forbid")

    limit_w: Watts | None = None
    gpus: list[GpuIndex] | None = Field(None, min_length=1, max_length=1024)
    per_node: dict[Name, dict[str, Watts]] | None = Field(None, min_length=1, max_length=10000)
    tenant: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    partition: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    labels: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict, max_length=32)
    )
    nodes: list[Name] | None = Field(None, min_length=1, max_length=10000)
    revert_after_s: float | None = Field(None, gt=0, le=MAX_REVERT_S)
    dry_run: bool = False
    reason: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _one_form(self) -> PowerOrderSpec:
        if self.per_node is not None:
            if self.limit_w is not None or self.gpus is not None or self.has_selector:
                raise ValueError("per_node is a whole plan: give no limit_w, gpus or selector")
            for node, plan in self.per_node.items():
                for g in plan:
                    if g != "*" and not (g.isdigit() and int(g) <= 1023):
                        raise ValueError(f"per_node.{node}: {g!r} is not a GPU index or '*'")
            return self
        if self.limit_w is None:
            raise ValueError("give limit_w (watts) or per_node")
        if not self.has_selector:
            raise ValueError("give a selector: tenant, partition, labels or nodes")
        return self

    @property
    def has_selector(self) -> bool:
        return bool(self.tenant or self.partition or self.labels or self.nodes)

    def limits_for(self, node: str) -> dict[str, float]:
        """The node's plan: GPU index (string) or ``"*"`` to watts."""
        if self.per_node is not None:
            return dict(self.per_node[node])
        assert self.limit_w is not None
        if self.gpus is None:
            return {"*": self.limit_w}
        return {str(g): self.limit_w for g in sorted(set(self.gpus))}


# -- energy reports (issue 16): ``GET /api/v1/energy`` ----------------------------------------
class EnergyFigures(_View):
    """kWh and GPU-hours of a sum, how they were measured (``counter``: the GPUs' energy
    counters, ``power``: integrated power samples, ``mixed``; None: nothing measured), the
    idle waste, and cost and CO2 where the policy has a price and a grid intensity (absent
    otherwise)."""

    kwh: float
    gpu_hours: float
    method: str | None
    counter_share: float | None
    idle_kwh: float
    idle_gpu_hours: float
    cost: float | None = None
    idle_cost: float | None = None
    co2_kg: float | None = None
    currency: str | None = None  # with a job's own figures (``JobDetail.energy``)


class EnergyRow(EnergyFigures):
    """One row of a report: its key (the job, tenant, node, model or day) and figures; a job's
    row also names its tenant and name."""

    key: str
    tenant: str | None = None
    name: str | None = None


class JobSlowdown(_View):
    """One job on a power order's GPUs: its reported throughput before and during the order
    (``unit`` per second), the slowdown and its energy per unit of work; None: unknown (the job
    reported no progress in that window)."""

    job: str
    name: str | None = None
    gpus: int
    unit: str | None = None
    rate_before: float | None = None
    rate_during: float | None = None
    slowdown: float | None = None
    energy_per_unit_before_j: float | None = None
    energy_per_unit_during_j: float | None = None


class PowerSavings(_View):
    """What a power order saved (issue 31; docs/energy.md): its GPUs' mean power in the
    ``baseline_s`` before it against during it, the energy (and, with a price, cost) saved over
    the measured GPU-hours, and the jobs' slowdown (None: unknown, never 0). Figures are None
    when no GPU could be compared (``not_compared`` says why)."""

    baseline_s: float
    currency: str | None = None
    basis: str | None = None
    gpus: int = 0
    before: dict[str, float] | None = None
    during: dict[str, float] | None = None
    before_w: float | None = None
    during_w: float | None = None
    gpu_hours: float | None = None
    saved_kwh: float | None = None
    saved_kwh_per_gpu_hour: float | None = None
    cost_saved: float | None = None
    slowdown: float | None = None
    slowdown_gpus: int = 0
    energy_per_work_saved: float | None = None
    saved_kwh_same_work: float | None = None
    cost_saved_same_work: float | None = None
    jobs: list[JobSlowdown] = []
    not_compared: list[dict[str, Any]] = []
    not_compared_count: int = 0


class PowerOrderSavings(PowerSavings):
    """A power order in force during an energy report's window and what it saved there."""

    order: int
    state: str
    spec: dict[str, Any] = {}


class EnergyReport(_View):
    """The energy report: rows per ``by`` key since ``since_s``, largest first, the total, and
    what the power orders in force in the window saved."""

    by: str
    since_s: float
    until_s: float
    currency: str
    price_per_kwh: float | None
    grid_gco2_per_kwh: float | None
    idle_util_pct: float
    rows: list[EnergyRow]
    total: EnergyFigures
    power_orders: list[PowerOrderSavings] = []


class NotifyReceiverStatus(_View):
    """One receiver's notifications in the outbox (issue 29): ``pending`` (``in_flight``: an
    attempt under way now), ``delivered``, ``failed_attempts`` (every attempt that failed,
    also of rows delivered later), ``dead`` (dead-lettered: attempts spent, too old, or
    refused for good), the oldest pending row's age and the last failure (a short reason such
    as ``HTTP 500``; never a URL or header). Counts cover the event retention."""

    receiver: str
    pending: int
    in_flight: int
    delivered: int
    failed_attempts: int
    dead: int
    oldest_pending_age_s: float | None
    last_error: str | None
    last_error_s: float | None


class NotifyStatus(_View):
    """``GET /notifications/status``: every receiver that has notifications in the outbox."""

    at_s: float
    receivers: list[NotifyReceiverStatus]
