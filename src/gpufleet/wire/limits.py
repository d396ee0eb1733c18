"""The limits of the wire contract, in one place: the pydantic models state them (so the OpenAPI
document does and the ingest path enforces them), and the agent sizes its batches by them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

SCHEMA_VERSION = 1
MAX_BATCH_BYTES = 8 * 2**20  # uncompressed JSON
MAX_GPUS_PER_NODE = 1024  # GPU indexes are 0 .. MAX_GPUS_PER_NODE - 1
MAX_SAMPLE_BLOCKS = 2 * MAX_GPUS_PER_NODE  # per batch: one block per GPU and sampling tier
MAX_SAMPLES_PER_BLOCK = 3600  # rows per block (the agent caps each GPU and tier at this)
MAX_FIELDS_PER_BLOCK = 128
MAX_FIELD_NAME = 64
FIELD_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"  # sample fields are snake_case names (power_w)
MAX_UUID = 96
MAX_FINDINGS = 4096
MAX_EVENTS = 4096
MAX_SEQ = 2**63 - 1  # a signed 64-bit column holds it
MAX_HEARTBEAT_S = 3600.0
# The longest an agent waits between two attempts to reach an unreachable control plane (its
# jittered backoff is capped at this and at its heartbeat interval), and the longest one attempt
# may take; a restarted control plane gives every node both plus one heartbeat interval on top
# of the lost threshold.
AGENT_MAX_BACKOFF_S = 5.0
AGENT_PUSH_TIMEOUT_S = 5.0

# a time or a reading: a finite JSON number (an integer is fine), never a string or a boolean
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
GpuIndex = Annotated[int, Field(strict=True, ge=0, lt=MAX_GPUS_PER_NODE)]
NoNul = Annotated[str, Field(pattern=r"^[^\x00]*$")]

WIRE_CONFIG = ConfigDict(extra="forbid", frozen=True)
