"""How the agent asks for health: a small seam between the sampler and `gpufleet.health`.

`HealthEvaluator` is any callable from a `NodeHealthInput` to a `HealthOutcome`. The agent uses
the health package's ``HealthTracker`` (`default_evaluator`); tests may inject another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devices.types import GpuEvent, Sample
from gpufleet.health.context import GpuHealthInput, GpuWindow, NodeHealthInput
from gpufleet.health.types import Finding, Severity

log = logging.getLogger("gpufleet.agent.health")


@dataclass(frozen=True)
class HealthOutcome:
    """The node verdict, per-GPU verdicts (by index) and the current findings."""

    verdict: Severity = Severity.UNKNOWN
    gpu_verdicts: dict[int, Severity] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    cleared: tuple[Finding, ...] = ()


HealthEvaluator = Callable[[NodeHealthInput], HealthOutcome]


@dataclass(frozen=True)
class GpuInputs:
    """What the sampler holds for one GPU, handed to `build_input`."""

    index: int
    info: Any  # DeviceInfo | None
    samples: Sequence[Sample]
    events: Sequence[GpuEvent]
    lost: bool
    stalled: bool


def build_input(node: str, gpus: Sequence[GpuInputs]) -> NodeHealthInput:
    infos = [g.info for g in gpus if g.info is not None]
    first = infos[0] if infos else None
    return NodeHealthInput(
        node=node,
        gpus=tuple(
            GpuHealthInput(
                index=g.index,
                uuid=None if g.info is None else g.info.uuid,
                info=g.info,
                window=GpuWindow.of(g.samples),
                events=tuple(g.events),
                lost=g.lost,
            )
            for g in gpus
        ),
        driver_version=None if first is None else first.driver_version,
        nvml_version=None if first is None else first.nvml_version,
        cuda_driver_version=None if first is None else first.cuda_driver_version,
    )


class TrackerEvaluator:
    """Adapts a ``gpufleet.health`` ``HealthTracker`` (``evaluate(node_input) -> HealthReport``)
    to a `HealthEvaluator`; ``tracker`` stays reachable (acknowledgements from the control
    plane are applied to it)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    def __call__(self, node_input: NodeHealthInput) -> HealthOutcome:
        report = self.tracker.evaluate(node_input)
        by_uuid = {g.uuid: g.index for g in node_input.gpus if g.uuid}
        verdicts: dict[int, Severity] = {}
        for key, sev in dict(getattr(report, "gpu_verdicts", {}) or {}).items():
            idx = key if isinstance(key, int) else by_uuid.get(str(key))
            if idx is None and isinstance(key, str) and key.startswith("gpu"):
                idx = int(key[3:]) if key[3:].isdigit() else None
            if idx is not None:
                verdicts[idx] = Severity(int(sev))
        return HealthOutcome(
            verdict=Severity(int(report.verdict)),
            gpu_verdicts=verdicts,
            findings=tuple(report.findings),
            cleared=tuple(getattr(report, "cleared", ()) or ()),
        )


def tracker_evaluator(tracker: Any) -> HealthEvaluator:
    """A `TrackerEvaluator` over ``tracker``."""
    return TrackerEvaluator(tracker)


def default_evaluator(
    clock: Callable[[], float], state_dir: Path | None = None, config: Any = None
) -> HealthEvaluator:
    """The health package's ``HealthTracker`` (acknowledgements and sticky findings kept under
    ``state_dir`` when it is writable, else in memory)."""
    from gpufleet.health.acks import FileAckStore, MemoryAckStore
    from gpufleet.health.tracker import HealthTracker

    store: Any = MemoryAckStore()
    if state_dir is not None:
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            store = FileAckStore(state_dir)
        except OSError as exc:
            log.warning("%s not writable (%s): acknowledgements kept in memory", state_dir, exc)
    return tracker_evaluator(HealthTracker(config, clock=clock, store=store))
