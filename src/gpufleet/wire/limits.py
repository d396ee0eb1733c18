"""The limits of the wire contract, in one place: the pydantic models state them (so the OpenAPI
document does and the ingest path enforces them), and the agent sizes its batches by them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

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
# The shortest heartbeat interval a batch may declare: the controller declares a node lost
# after a few intervals of silence, so a tiny one (1e-9 was accepted) made the node lost at
# once; 0.1 s is well under any agent's push (the agent refuses a shorter --push-interval).
MIN_HEARTBEAT_S = 0.1
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

# --- node names -------------------------------------------------------------------------------
# One rule everywhere a node is named (ingest, validation results, the Slurm commands): host name
# characters only, so a name is one URL path segment, one Prometheus label value, one argument
# that scontrol reads as one node (no hostlist brackets or commas), one line in a log.
MAX_NODE_NAME = 253  # a DNS name's limit
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
NODE_NAME_RULE = (
    "letters, digits, '.', '-' and '_', starting with a letter or digit, "
    f"at most {MAX_NODE_NAME} characters"
)
_NODE_NAME = re.compile(NODE_NAME_PATTERN.rstrip("$") + r"\Z")


def is_node_name(name: str) -> bool:
    """Whether ``name`` follows the node-name rule (`NODE_NAME_RULE`)."""
    return bool(_NODE_NAME.match(name))


def _node_name(name: str) -> str:
    if not is_node_name(name):
        raise PydanticCustomError(
            "node_name",
            "'{name}' is not a node name: {rule}",
            {"name": name[:80], "rule": NODE_NAME_RULE},
        )
    return name


NodeName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NODE_NAME, json_schema_extra={"pattern": NODE_NAME_PATTERN}),
    AfterValidator(_node_name),
]

# --- what a sample may hold ---------------------------------------------------------------------
# A sample is kept when its time lies within this window around the controller's clock: ahead,
# agents' clocks drift a little (NTP keeps them within seconds; 5 min is generous), and a sample
# from the future would pin a GPU's "latest" value until real time caught up. Behind, an agent
# replays its spool after an outage; the spool is bounded by batch count, not age (agent.spool),
# so the window is the control plane's own horizon: the idempotency window and rollup retention
# (7 days, control.service): an older sample has no rollup left to join.
SAMPLE_AHEAD_S = 300.0
SAMPLE_BEHIND_S = 7 * 86400.0

# Readings outside these ranges are dropped (one by one, counted by field in the Ack), for every
# metric the control plane keeps (control.state.rings.FIELDS; the names and units of
# gpufleet.devices.types.Sample).
SAMPLE_RANGES: dict[str, tuple[float, float]] = {
    # NVML utilisation rates are percentages of a sample period
    "gpu_util_pct": (0.0, 100.0),
    "mem_util_pct": (0.0, 100.0),
    # board power: never negative; no GPU module draws 10 kW (a GB200 superchip is ~2.7 kW)
    "power_w": (0.0, 10_000.0),
    # NVML reports degrees C; silicon shuts down long before 200 C, -40 C is the cold limit
    # of datacentre hardware
    "gpu_temp_c": (-40.0, 200.0),
    "mem_temp_c": (-40.0, 200.0),
    # clocks in MHz: never negative; 100 GHz is far beyond any GPU
    "sm_clock_mhz": (0.0, 100_000.0),
    "mem_clock_mhz": (0.0, 100_000.0),
    # bytes of frame buffer in use: never negative; 1 PiB is far beyond any one GPU
    "mem_used_bytes": (0.0, 2.0**50),
    # PCIe throughput: never negative; 1 TB/s is beyond PCIe 7 x16
    "pcie_tx_bytes_per_s": (0.0, 1e12),
    "pcie_rx_bytes_per_s": (0.0, 1e12),
    # a 64-bit mask of NVML clocks-event reasons and a 64-bit error counter
    "clock_event_reasons": (0.0, 2.0**64),
    "ecc_dbe_volatile": (0.0, 2.0**64),
}
TIME_FIELD = "t"  # the key under which dropped samples (time outside the window) are counted
EVENT_FIELD = "events"  # the key for device events dropped for the same reason
