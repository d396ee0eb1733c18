"""What the readiness checks are told (the site's declarations) and what NVML said."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Expectations:
    """What the site declares; ``None`` means "not declared": the check reports what it sees
    and judges only what needs no declaration."""

    cuda: tuple[str, ...] = ()  # CUDA releases jobs use, e.g. ("12.4",)
    ib_rate_gbps: float | None = None  # every InfiniBand/RoCE port's rate, e.g. 400
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"
    mtu: int | None = None  # the ports' network interface MTU, e.g. 4092 or 9000
    nvswitch: bool | None = None  # None: detect NVSwitches on the PCI bus
    containers: bool | None = None  # None: check the runtime only where an engine is installed
    host_memory_ratio: float = 2.0  # host RAM >= ratio x total GPU memory


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML reported on this node; every field None/empty when NVML was not read."""

    driver_version: str | None = None
    gpu_count: int | None = None
    gpu_memory_bytes: tuple[int, ...] = ()
    # nvmlDeviceGetGpuFabricInfo state per GPU, lower case: "not_supported", "not_started",
    # "in_progress", "completed" (NVML API Reference, nvmlGpuFabricState_t)
    fabric_states: tuple[str, ...] = field(default_factory=tuple)
