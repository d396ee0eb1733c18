"""Health rules: pure functions from samples, events and device info to findings, a registry,
and a tracker that clears findings explicitly (hardware ones only by acknowledgement).

API for the agent (and anyone else)::

    from gpufleet.health import (
        HealthTracker, HealthConfig, load_health_config, NodeHealthInput, GpuHealthInput,
        GpuWindow, FileAckStore,
    )

    tracker = HealthTracker(load_health_config(path_or_None), clock=time.time,
                            store=FileAckStore(state_dir))      # store optional (memory)
    report = tracker.evaluate(NodeHealthInput(
        node="gpu-a-01",
        gpus=(GpuHealthInput(index=0, uuid=info.uuid, info=info,
                             window=GpuWindow.of(samples),   # recent Samples, any order
                             events=tuple(new_events),       # GpuEvents (new or recent)
                             lost=False), ...),
        driver_version=..., nvml_version=..., cuda_driver_version=...,  # optional
    ))
    report.verdict        # Severity: worst active finding; UNKNOWN when a GPU has no data
    report.findings       # tuple[Finding], active, worst first (first_seen_s, last_seen_s set)
    report.gpu_verdicts   # dict[uuid (or "gpu<index>"), Severity]
    report.cleared        # tuple[Finding] cleared in this evaluation (or acknowledged since)
    report.errors         # tuple[str]: rules that raised; the others still ran
    report.to_dict()      # JSON-ready, severities as words
    tracker.acknowledge(code, component, who, why) -> Acknowledgement
    tracker.acknowledgements() -> list[Acknowledgement]
    tracker.active        # tuple[Finding]

One tracker per node. ``collect_node(backend, duration_s=3)`` builds a `NodeHealthInput` from a
`GpuBackend` (what ``gpufleet health`` does). ``all_rules()`` lists the registry.
"""

from gpufleet.health.acks import (
    Acknowledgement,
    AckStore,
    FileAckStore,
    MemoryAckStore,
    default_state_dir,
)
from gpufleet.health.collect import collect_node
from gpufleet.health.config import HealthConfig, health_config_from_mapping, load_health_config
from gpufleet.health.context import (
    GpuContext,
    GpuHealthInput,
    GpuWindow,
    NodeContext,
    NodeHealthInput,
)
from gpufleet.health.registry import RULES, Rule, RuleParams, register_rule
from gpufleet.health.rules import all_rules
from gpufleet.health.tracker import HealthReport, HealthTracker
from gpufleet.health.types import Finding, Severity

__all__ = [
    "RULES",
    "AckStore",
    "Acknowledgement",
    "FileAckStore",
    "Finding",
    "GpuContext",
    "GpuHealthInput",
    "GpuWindow",
    "HealthConfig",
    "HealthReport",
    "HealthTracker",
    "MemoryAckStore",
    "NodeContext",
    "NodeHealthInput",
    "Rule",
    "RuleParams",
    "Severity",
    "all_rules",
    "collect_node",
    "default_state_dir",
    "health_config_from_mapping",
    "load_health_config",
    "register_rule",
]
