"""A simulated node watched by a HealthTracker: the production NVML backend over SimFleet,
sampled once a (simulated) second into a rolling window, like the agent's sampler."""

from __future__ import annotations

from collections import deque

from gpufleet.devices.sim import Fault, FaultKind, Load, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.types import GpuEvent, Sample
from gpufleet.errors import DeviceError, GpuLostError
from gpufleet.health import (
    GpuHealthInput,
    GpuWindow,
    HealthConfig,
    HealthReport,
    HealthTracker,
    MemoryAckStore,
    NodeHealthInput,
)
from gpufleet.health.acks import AckStore
from gpufleet.health.types import Finding


class Rig:
    """One simulated node (``sim-00``), its backend, and a tracker on the same clock."""

    def __init__(
        self,
        spec: str = "1x4xh100-sxm",
        *,
        config: HealthConfig | None = None,
        window_s: float = 60.0,
        store: AckStore | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.fleet = SimFleet(parse_fleet_spec(spec, seed=11), clock=self.clock)
        self.node = self.fleet.node("sim-00")
        self.backend = self.node.backend()
        self.store = store if store is not None else MemoryAckStore()
        self.tracker = HealthTracker(config, clock=self.clock, store=self.store)
        self.window_s = window_s
        self.samples: dict[int, deque[Sample]] = {i: deque() for i in range(len(self.node.gpus))}
        self.uuids = {i: g.uuid for i, g in enumerate(self.node.gpus)}

    def inject(self, kind: FaultKind, gpu: int | None = 0, **kw: object) -> None:
        at_s = float(kw.pop("at_s", self.clock() - self.node.gpus[0].t0))  # type: ignore[arg-type]
        duration = kw.pop("duration_s", None)
        self.fleet.inject(
            Fault(kind, node="sim-00", gpu=gpu, at_s=at_s, duration_s=duration, params=dict(kw))  # type: ignore[arg-type]
        )

    def load(self, gpu: int, util: float = 1.0) -> None:
        self.node.gpus[gpu].run(Load(util=util), start_s=self.clock())

    def run(self, seconds: float, interval_s: float = 1.0) -> HealthReport:
        """Sample every ``interval_s`` for ``seconds`` (the window rolls), then evaluate."""
        events: list[GpuEvent] = []
        steps = max(1, round(seconds / interval_s))
        for _ in range(steps):
            self.clock.advance(interval_s)
            now = self.clock()
            for i, buf in self.samples.items():
                if i in self.backend.lost_gpus():
                    continue
                try:
                    buf.append(self.backend.sample(i))
                except (GpuLostError, DeviceError):
                    continue
                while buf and buf[0].timestamp_s < now - self.window_s:
                    buf.popleft()
            try:
                events.extend(self.backend.poll_events())
            except DeviceError:  # see collect_node: an XID of a lost GPU breaks poll_events
                continue
        return self.evaluate(events)

    def evaluate(self, events: list[GpuEvent] | None = None) -> HealthReport:
        events = events or []
        gpus = []
        for i in self.samples:
            info = None
            if i not in self.backend.lost_gpus():
                try:
                    info = self.backend.device_info(i)
                except (GpuLostError, DeviceError):
                    info = None
            gpus.append(
                GpuHealthInput(
                    index=i,
                    uuid=self.uuids[i],
                    info=info,
                    window=GpuWindow.of(self.samples[i]),
                    events=tuple(e for e in events if e.gpu_index == i),
                    lost=i in self.backend.lost_gpus(),
                )
            )
        versions = self.backend.system_versions()
        return self.tracker.evaluate(
            NodeHealthInput(
                node="sim-00",
                gpus=tuple(gpus),
                driver_version=versions["driver_version"],
                nvml_version=versions["nvml_version"],
                cuda_driver_version=versions["cuda_driver_version"],
            )
        )


def codes(report: HealthReport, gpu: int | None = None) -> set[str]:
    return {f.code for f in report.findings if gpu is None or f.gpu_index == gpu}


def find(report: HealthReport, code: str) -> Finding:
    matches = [f for f in report.findings if f.code == code]
    assert len(matches) == 1, f"{code}: {[f.code for f in report.findings]}"
    return matches[0]
