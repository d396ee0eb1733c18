"""The agent's health rules for the light simulated agents of `gpufleet up` and `sim-fleet`.

Keeps a short window of samples per GPU, the events since the last evaluation and which GPUs are
lost, and runs a `gpufleet.health.HealthTracker` over them: the same rules, severities, actions
and sticky behaviour as `gpufleet agent`, as wire-format finding dicts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample
from gpufleet.errors import DeviceError
from gpufleet.health import GpuHealthInput, GpuWindow, HealthTracker, NodeHealthInput
from gpufleet.jsonable import to_jsonable
from gpufleet.wire import WireAck

WINDOW = 60  # samples per GPU the rules see (a minute at 1 Hz)


class SimHealth:
    """Health evaluation for one simulated node (rate-limited; at once when events arrive)."""

    def __init__(self, node: str, clock: Callable[[], float], interval_s: float = 2.0) -> None:
        self.node = node
        self.clock = clock
        self.interval_s = interval_s
        self.tracker = HealthTracker(None, clock=clock)
        self.samples: dict[int, deque[Sample]] = {}
        self.events: list[GpuEvent] = []
        self.lost: set[int] = set()
        self.infos: dict[int, DeviceInfo] = {}
        self._last = -float("inf")

    def observe(self, index: int, sample: Sample) -> None:
        self.samples.setdefault(index, deque(maxlen=WINDOW)).append(sample)

    def observe_events(self, events: list[GpuEvent]) -> None:
        self.events.extend(events)

    def observe_lost(self, index: int) -> None:
        self.lost.add(index)

    def _info(self, backend: GpuBackend, index: int) -> DeviceInfo | None:
        if index not in self.infos and index not in self.lost:
            try:
                self.infos[index] = backend.device_info(index)
            except DeviceError:
                return None
        return self.infos.get(index)

    def acknowledge(self, acks: list[WireAck]) -> list[tuple[str, str]]:
        """Apply acknowledgements made on the control plane to the tracker (logged in its ack
        store); ones no longer active are ignored. Returns the (code, component) acknowledged."""
        done = []
        for a in acks:
            key = (a.code, a.component)
            if not any(f.sticky and f.key == key for f in self.tracker.active):
                continue
            self.tracker.acknowledge(a.code, a.component, a.who, a.why)
            done.append(key)
        return done

    def evaluate(
        self, now: float, backend: GpuBackend, urgent: bool = False
    ) -> list[dict[str, Any]] | None:
        """The active findings as wire dicts, or None when it is not time to evaluate yet."""
        if not urgent and not self.lost and now - self._last < self.interval_s:
            return None
        self._last = now
        indexes = sorted(set(self.samples) | self.lost)
        gpus = []
        for i in indexes:
            info = self._info(backend, i)
            gpus.append(
                GpuHealthInput(
                    index=i,
                    uuid=info.uuid if info else f"{self.node}-gpu{i}",
                    info=info,
                    window=GpuWindow.of(list(self.samples.get(i, ()))),
                    events=tuple(e for e in self.events if e.gpu_index == i),
                    lost=i in self.lost,
                )
            )
        first = next(iter(self.infos.values()), None)
        report = self.tracker.evaluate(
            NodeHealthInput(
                node=self.node,
                gpus=tuple(gpus),
                driver_version=first.driver_version if first else None,
                nvml_version=first.nvml_version if first else None,
                cuda_driver_version=first.cuda_driver_version if first else None,
            )
        )
        self.events = []
        return [
            {
                "rule": f.rule,
                "code": f.code,
                "severity": int(f.severity),
                "component": f.component,
                "message": f.message,
                "action": str(f.action.value),
                "evidence": to_jsonable(f.evidence),
                "sticky": f.sticky,
                "gpu_index": f.gpu_index,
                "first_seen_s": f.first_seen_s,
                "last_seen_s": f.last_seen_s,
            }
            for f in report.findings
            if int(f.severity) > 0
        ]
