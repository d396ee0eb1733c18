"""The push exchange: a `Batch` from an agent, the control plane's `Ack` in return.

One batch per push: ``POST /api/v1/ingest`` with a JSON body (``Content-Encoding: gzip``
allowed), ``Authorization: Bearer <agent token>``. Batches carry a per-agent sequence number,
strictly increasing from 1; the control plane stores each (agent_id, seq) once, so a replayed
batch is acknowledged again but not stored twice. Samples are columnar per GPU (one list per
field) to keep batches small. ``findings`` is the agent's complete current set (a snapshot): a
finding missing from a later batch has cleared on the node.

Responses: 200 ``Ack`` once the batch is durable; 400/422 malformed (with a reason naming the
field); 401/403 bad token; 413 oversized; 429 with ``Retry-After`` under back-pressure.
``node`` follows the node-name rule (``limits.NODE_NAME_RULE``: host name characters).

Samples and device events are screened one by one (``limits.SAMPLE_AHEAD_S``,
``SAMPLE_BEHIND_S``, ``SAMPLE_RANGES``): one whose time is outside the window around the
control plane's clock, or a reading outside its field's range, is left out and counted in the
``Ack``'s ``dropped``; the rest of the batch (heartbeat, findings, other samples) is stored.
Only a batch with nothing left to store but its heartbeat is answered 422 (the heartbeat
still counts).

Jobs ride on the same exchange, as additive optional fields (``schema_version`` stays 1: a
batch or ack without them means what it always meant): an agent that runs jobs puts a ``jobs``
report in each batch (its GPUs, its lease, every copy it knows), and the ``Ack`` carries
``commands`` (start/kill copies of jobs, each with its generation as a fence token). An agent
that sends no ``jobs`` (``None``) runs no jobs; an ``Ack`` without ``commands`` asks nothing.

Acknowledgements (additive, v1 as well): when an operator acknowledges on the control plane a
sticky finding that the node's agent still reports, every ``Ack`` to that node carries it in
``acks`` until the agent's snapshot no longer holds the finding. The agent acknowledges it in
its own health tracker, so its next snapshot omits the finding and the control plane clears it.
An ``Ack`` without ``acks`` (the field is left out when empty) acknowledges nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.wire.findings import WireAck, WireFinding
from gpufleet.wire.jobs import WireCommand, WireJobs
from gpufleet.wire.limits import (
    MAX_EVENTS,
    MAX_FINDINGS,
    MAX_GPUS_PER_NODE,
    MAX_HEARTBEAT_S,
    MAX_SAMPLE_BLOCKS,
    MAX_SEQ,
    MIN_HEARTBEAT_S,
    WIRE_CONFIG,
    FiniteNumber,
    NodeName,
    NoNul,
)
from gpufleet.wire.maintenance import WireUpdateOrder
from gpufleet.wire.power import WirePowerOrder
from gpufleet.wire.telemetry import WireDevice, WireEvent, WireHost, WireSamples


class Batch(BaseModel):
    """One push from one agent: samples, findings, events, its verdict and its jobs report."""

    model_config = WIRE_CONFIG

    schema_version: Literal[1] = 1  # SCHEMA_VERSION
    node: NodeName
    agent_id: NoNul = Field(min_length=1, max_length=128)
    seq: int = Field(ge=1, le=MAX_SEQ)
    sent_at_s: FiniteNumber
    heartbeat_interval_s: float = Field(2.0, ge=MIN_HEARTBEAT_S, le=MAX_HEARTBEAT_S)
    # on the first batch and whenever they change
    devices: list[WireDevice] | None = Field(None, max_length=MAX_GPUS_PER_NODE)
    host: WireHost | None = None  # CPUs and memory, with ``devices`` (additive, v1)
    samples: list[WireSamples] = Field(default_factory=list, max_length=MAX_SAMPLE_BLOCKS)
    findings: list[WireFinding] = Field(default_factory=list, max_length=MAX_FINDINGS)
    events: list[WireEvent] = Field(default_factory=list, max_length=MAX_EVENTS)
    health: int = Field(0, ge=0, le=3)  # node verdict (Severity)
    buffered: bool = False  # True when replayed from the agent's disk buffer
    jobs: WireJobs | None = None  # additive (v1): only agents that run jobs send it


class Ack(BaseModel):
    """The control plane's answer to a batch: durable (``duplicate``: it already was), with
    jobs to start or kill and findings acknowledged.

    Agents ignore fields they do not know (``extra="ignore"``), so a newer control plane can add
    optional fields to the answer without stalling older agents; the batch side stays strict.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str
    seq: int
    duplicate: bool = False
    commands: list[WireCommand] = Field(default_factory=list)  # jobs to start/kill
    acks: list[WireAck] = Field(default_factory=list)  # findings acknowledged
    # samples and events the control plane left out, counted by field: a reading outside its
    # range under the field's name, a sample whose time is outside the window under "t",
    # events under "events" (`gpufleet.wire.limits`); left out of the answer when empty
    dropped: dict[str, int] = Field(default_factory=dict)
    # the node waits in ``validating`` since this time (control-plane clock): its agent runs
    # validation level 1 once per such period and posts the result (`gpufleet.agent.gate`);
    # absent in every other state
    validate_since_s: float | None = None
    # the level the agent validates at in that period: absent (level 1, the agent's own gate)
    # unless a maintenance campaign asks more (issue 15, ``--validate-level 2``)
    validate_level: int | None = Field(None, ge=1, le=3)
    # a maintenance campaign asks the node's agent to run the site's update command (issue 15,
    # `gpufleet.wire.maintenance`); absent otherwise
    update: WireUpdateOrder | None = None
    # power orders waiting for the node's answer (issue 16, `gpufleet.wire.power`); empty otherwise
    power: list[WirePowerOrder] = Field(default_factory=list)
