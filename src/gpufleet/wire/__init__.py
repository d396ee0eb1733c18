"""Every message between agent, control plane and CLI, with all its constraints.

The layer just above the catalog: it imports pydantic, the standard library and nothing else of
gpufleet but `gpufleet.catalog`, `gpufleet.errors` and `gpufleet.jsonable`. Modules: `limits`
(the constants), `telemetry` (devices, samples, events), `findings` (findings,
acknowledgements), `jobs` (job specs, jobs reports, commands), `batch` (`Batch`, `Ack`),
`validation` (validation results), `validation_report` (the report file), `problems` (a
refused message's first problem, named by its field path).
"""

from gpufleet.wire.batch import Ack, Batch
from gpufleet.wire.findings import WireAck, WireFinding
from gpufleet.wire.jobs import (
    JOB_SPEC,
    JobRequest,
    JobSpec,
    JobSubmit,
    WireCommand,
    WireJobCopy,
    WireJobs,
    WireSlot,
)
from gpufleet.wire.limits import (
    AGENT_MAX_BACKOFF_S,
    AGENT_PUSH_TIMEOUT_S,
    MAX_BATCH_BYTES,
    MAX_GPUS_PER_NODE,
    MAX_SAMPLES_PER_BLOCK,
    SCHEMA_VERSION,
)
from gpufleet.wire.maintenance import WireUpdateOrder, WireUpdateReport
from gpufleet.wire.power import WireGpuPower, WirePowerOrder, WirePowerReport
from gpufleet.wire.telemetry import WireDevice, WireEvent, WireHost, WireSamples

__all__ = [
    "AGENT_MAX_BACKOFF_S",
    "AGENT_PUSH_TIMEOUT_S",
    "JOB_SPEC",
    "MAX_BATCH_BYTES",
    "MAX_GPUS_PER_NODE",
    "MAX_SAMPLES_PER_BLOCK",
    "SCHEMA_VERSION",
    "Ack",
    "Batch",
    "JobRequest",
    "JobSpec",
    "JobSubmit",
    "WireAck",
    "WireCommand",
    "WireDevice",
    "WireEvent",
    "WireFinding",
    "WireGpuPower",
    "WireHost",
    "WireJobCopy",
    "WireJobs",
    "WirePowerOrder",
    "WirePowerReport",
    "WireSamples",
    "WireSlot",
    "WireUpdateOrder",
    "WireUpdateReport",
]
