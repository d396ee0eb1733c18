"""The agent -> control plane wire schema, version 1.

One batch per push: ``POST /api/v1/ingest`` with a JSON body (``Content-Encoding: gzip``
allowed), ``Authorization: Bearer <agent token>``. Batches carry a per-agent sequence number,
strictly increasing from 1; the control plane stores each (agent_id, seq) once, so a replayed
batch is acknowledged again but not stored twice. Samples are columnar per GPU (one list per
field) to keep batches small. ``findings`` is the agent's complete current set (a snapshot): a
finding missing from a later batch has cleared on the node.

Responses: 200 ``Ack`` once the batch is durable; 400/422 malformed (with a reason); 401/403
bad token; 413 oversized; 429 with ``Retry-After`` under back-pressure.

Jobs (issue 7) ride on the same exchange, as additive optional fields (``schema_version`` stays
1: a batch or ack without them means what it always meant): an agent that runs jobs puts a
``jobs`` report in each batch (its GPUs, its lease, every copy it knows), and the ``Ack`` carries
``commands`` (start/kill copies of jobs, each with its generation as a fence token). An agent
that sends no ``jobs`` (``None``) runs no jobs; an ``Ack`` without ``commands`` asks nothing.

Acknowledgements (additive, v1 as well): when an operator acknowledges on the control plane a
sticky finding that the node's agent still reports, every ``Ack`` to that node carries it in
``acks`` (code, component, who, why, at_s) until the agent's snapshot no longer holds the
finding. The agent acknowledges it in its own health tracker (logged in its ack log; one that is
no longer active is ignored), so its next snapshot omits the finding and the control plane
clears it. An ``Ack`` without ``acks`` (the field is left out when empty) acknowledges nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
MAX_BATCH_BYTES = 8 * 2**20  # uncompressed JSON


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WireDevice(_Wire):
    """A GPU's identity and configuration: `gpufleet.devices.types.DeviceInfo` as a mapping."""

    index: int
    uuid: str
    info: dict[str, Any]


class WireSamples(_Wire):
    """Samples of one GPU, columnar: ``fields[name][i]`` was read at ``t[i]``."""

    gpu_uuid: str
    gpu_index: int
    t: list[float]
    fields: dict[str, list[float | None]]


class WireFinding(_Wire):
    """A `gpufleet.health.types.Finding` on the wire (severity as its integer)."""

    rule: str
    code: str
    severity: int = Field(ge=0, le=3)
    component: str
    message: str
    action: str = "none"
    evidence: dict[str, Any] = Field(default_factory=dict)
    sticky: bool = False
    gpu_index: int | None = None
    first_seen_s: float = 0.0
    last_seen_s: float = 0.0


class WireEvent(_Wire):
    """A `gpufleet.devices.types.GpuEvent` on the wire."""

    gpu_index: int
    gpu_uuid: str | None = None
    kind: str
    timestamp_s: float
    xid: int | None = None
    detail: str = ""


class WireSlot(_Wire):
    """One GPU a job may be placed on (catalog model key and memory)."""

    index: int = Field(ge=0, le=1023)
    model: str = Field(max_length=64)
    memory_bytes: int = Field(ge=0)


class WireJobCopy(_Wire):
    """What the agent knows of one copy of a job (running, or how it ended)."""

    job_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=0)
    running: bool
    exit_code: int | None = None
    reason: str = Field("", max_length=500)
    node_fault: bool = False  # it died because of the node (a GPU fell off the bus, ...)
    log_tail: str | None = Field(None, max_length=8192)  # end of its output, when changed


class WireJobs(_Wire):
    """An agent's jobs report: its schedulable GPUs, its lease, and its copies of jobs."""

    lease_s: float = Field(gt=0, le=86400)  # cut off this long, the agent kills its own jobs
    slots: list[WireSlot] = Field(default_factory=list)
    copies: list[WireJobCopy] = Field(default_factory=list)


class WireCommand(_Wire):
    """The control plane asks the agent to start or kill one copy of a job."""

    op: Literal["start", "kill"]
    job_id: str = Field(min_length=1, max_length=64)
    generation: int = Field(ge=0)
    gpus: list[int] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    spec: dict[str, Any] = Field(default_factory=dict)  # a JobSpec as a mapping (start only)


class WireAck(_Wire):
    """An operator's acknowledgement of a sticky finding (``code`` on ``component``), made on
    the control plane, for the node's agent to apply to its own health tracker."""

    code: str = Field(min_length=1, max_length=64)
    component: str = Field(min_length=1, max_length=96)
    who: str = Field(min_length=1, max_length=128)  # the operator (an actor name)
    why: str = Field(min_length=1, max_length=1000)
    at_s: float  # when it was acknowledged (control-plane clock)


class Batch(_Wire):
    """One push from one agent."""

    schema_version: Literal[1] = 1  # SCHEMA_VERSION
    node: str = Field(min_length=1, max_length=253)
    agent_id: str = Field(min_length=1, max_length=128)
    seq: int = Field(ge=1)
    sent_at_s: float
    heartbeat_interval_s: float = 2.0
    devices: list[WireDevice] | None = None  # on the first batch and whenever they change
    samples: list[WireSamples] = Field(default_factory=list)
    findings: list[WireFinding] = Field(default_factory=list)
    events: list[WireEvent] = Field(default_factory=list)
    health: int = Field(0, ge=0, le=3)  # node verdict (Severity)
    buffered: bool = False  # True when replayed from the agent's disk buffer
    jobs: WireJobs | None = None  # additive (v1): only agents that run jobs send it


class Ack(_Wire):
    """The control plane's answer to a batch.

    Agents ignore fields they do not know (``extra="ignore"``), so a newer control plane can add
    optional fields to the answer without stalling older agents; the batch side stays strict.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str
    seq: int
    duplicate: bool = False
    commands: list[WireCommand] = Field(default_factory=list)  # additive (v1): jobs to start/kill
    acks: list[WireAck] = Field(default_factory=list)  # additive (v1): findings acknowledged
