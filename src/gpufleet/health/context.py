"""What a health rule sees: a window of recent samples per GPU, its events, its identity.

The sampler hands the tracker a `NodeHealthInput` (one `GpuHealthInput` per GPU); the tracker
turns it into one `GpuContext` per GPU (adding the clock's ``now_s``, the node name and the
XID history it keeps) and one `NodeContext` for node-level rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample


@dataclass(frozen=True)
class GpuWindow:
    """Recent samples of one GPU, oldest first. Slow-tier fields appear only in some samples,
    so readers ask for the newest value that is present (`latest`) or the present values
    (`series`)."""

    samples: tuple[Sample, ...] = ()

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> GpuWindow:
        """A window from samples in any order (sorted by timestamp here)."""
        return cls(tuple(sorted(samples, key=lambda s: s.timestamp_s)))

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def timestamps(self) -> tuple[float, ...]:
        return tuple(s.timestamp_s for s in self.samples)

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    @property
    def span_s(self) -> float:
        return self.samples[-1].timestamp_s - self.samples[0].timestamp_s if self.samples else 0.0

    def latest(self, name: str) -> Any:
        """The newest non-None value of the field ``name`` (None when no sample has it)."""
        for s in reversed(self.samples):
            v = getattr(s, name)
            if v is not None:
                return v
        return None

    def series(self, name: str) -> list[tuple[float, float]]:
        """``(timestamp_s, value)`` of every sample where the field ``name`` is present."""
        out: list[tuple[float, float]] = []
        for s in self.samples:
            v = getattr(s, name)
            if v is not None:
                out.append((s.timestamp_s, float(v)))
        return out

    def counter_increase(self, name: str) -> tuple[float, float] | None:
        """``(increase, span_s)`` of a cumulative counter over the window; a counter that goes
        down (reset by a GPU reset or reboot) counts from its new value. None: fewer than two
        readings."""
        pts = self.series(name)
        if len(pts) < 2:
            return None
        inc = 0.0
        for (_, a), (_, b) in itertools.pairwise(pts):
            inc += b - a if b >= a else b
        return inc, pts[-1][0] - pts[0][0]

    def counter_rise(
        self, name: str, min_span_s: float, min_increase: float
    ) -> tuple[float, float] | None:
        """`counter_increase` when it spans ``min_span_s`` or more and rose by ``min_increase``
        or more (a rate needs both); else None."""
        inc = self.counter_increase(name)
        if inc is None or inc[1] < min_span_s or inc[0] < min_increase:
            return None
        return inc


@dataclass(frozen=True)
class GpuHealthInput:
    """One GPU as the sampler hands it over: identity (None when never read, e.g. lost at
    start), recent samples, new or recent events, and whether NVML reports it lost."""

    index: int
    uuid: str | None = None
    info: DeviceInfo | None = None
    window: GpuWindow = field(default_factory=GpuWindow)
    events: tuple[GpuEvent, ...] = ()
    lost: bool = False


@dataclass(frozen=True)
class NodeHealthInput:
    """One node as the sampler hands it over. The ``*_version`` fields are the node-wide NVML
    answers (``nvmlSystemGet*``); None where unknown."""

    node: str
    gpus: tuple[GpuHealthInput, ...] = ()
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None


@dataclass(frozen=True)
class GpuContext:
    """What a GPU rule receives."""

    node: str
    now_s: float
    index: int
    uuid: str | None
    info: DeviceInfo | None
    window: GpuWindow
    events: tuple[GpuEvent, ...]  # events the tracker still remembers for this GPU, oldest first
    lost: bool

    @property
    def component(self) -> str:
        """The finding's component: the UUID, or ``gpu<index>`` when the UUID is unknown."""
        return self.uuid or f"gpu{self.index}"


@dataclass(frozen=True)
class NodeContext:
    """What a node rule receives: every GPU's context plus the node-wide versions."""

    node: str
    now_s: float
    gpus: tuple[GpuContext, ...]
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
