"""The limits of the wire contract, in one place: the pydantic models state them (so the OpenAPI
document does and the ingest path enforces them), and the agent sizes its batches by them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

SCHEMA_VERSION = 1
MAX_BATCH_BYTES = 8 * 2**20  # uncompressed JSON
# GPU indexes are 0 .. MAX_GPUS_PER_NODE - 1. The catalog's largest system holds 8 GPUs (HGX
# and DGX boards; a GB200 NVL72 compute tray holds 4): 16 leaves room for a denser board, not
# for one token registering thousands of GPUs (tests/wire/test_limits.py checks the catalog)
MAX_GPUS_PER_NODE = 16
MAX_SAMPLE_BLOCKS = 2 * MAX_GPUS_PER_NODE  # per batch: one block per GPU and sampling tier
MAX_SAMPLES_PER_BLOCK = 3600  # rows per block (the agent caps each GPU and tier at this)
# rows in one batch, all blocks together: a spool replay of a full node fits, no more
MAX_SAMPLES_PER_BATCH = MAX_SAMPLE_BLOCKS * MAX_SAMPLES_PER_BLOCK
MAX_FIELDS_PER_BLOCK = 128
MAX_FIELD_NAME = 64
FIELD_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"  # sample fields are snake_case names (power_w)
MAX_UUID = 96
MAX_FINDINGS = 4096
MAX_EVENTS = 4096
MAX_SEQ = 2**63 - 1  # a signed 64-bit column holds it
MAX_HEARTBEAT_S = 3600.0

# a time or a reading: a finite JSON number (an integer is fine), never a string or a boolean
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
GpuIndex = Annotated[int, Field(strict=True, ge=0, lt=MAX_GPUS_PER_NODE)]
NoNul = Annotated[str, Field(pattern=r"^[^\x00]*$")]

WIRE_CONFIG = ConfigDict(extra="forbid", frozen=True)
