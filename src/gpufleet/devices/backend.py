"""The `GpuBackend` protocol every device source implements, and the registry of backends.

A backend answers for the GPUs of one node. The NVML backend serves both real GPUs and the
simulator (which speaks NVML), so the protocol has few implementations by design.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample


@runtime_checkable
class GpuBackend(Protocol):
    """What the rest of gpufleet may ask of a node's GPUs."""

    node_name: str

    def device_count(self) -> int:
        """How many GPUs the node has (lost ones included)."""
        ...

    def device_info(self, index: int) -> DeviceInfo:
        """Identity and configuration of one GPU. Raises GpuLostError for a lost GPU."""
        ...

    def sample_fast(self, index: int) -> Sample:
        """The cheap fields (one batched NVML call plus a few getters)."""
        ...

    def sample_slow(self, index: int) -> Sample:
        """The expensive fields (energy, PCIe counters, violation times, ...)."""
        ...

    def sample(self, index: int) -> Sample:
        """Both tiers merged into one sample."""
        ...

    def poll_events(self, timeout_ms: int = 0) -> list[GpuEvent]:
        """XID and lost-GPU events since the last poll."""
        ...

    def lost_gpus(self) -> frozenset[int]:
        """Indexes of GPUs that fell off the bus."""
        ...

    def problems(self) -> list[str]:
        """Functions not found, permission problems and similar, each once, for `doctor`."""
        ...

    def close(self) -> None:
        """Release the library (nvmlShutdown)."""
        ...


BackendFactory = Callable[..., GpuBackend]
BACKENDS: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Class decorator: make a backend constructible by name."""

    def deco(factory: BackendFactory) -> BackendFactory:
        BACKENDS[name] = factory
        return factory

    return deco
