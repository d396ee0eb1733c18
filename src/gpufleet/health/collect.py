"""Read one node's GPUs for a short window into a `NodeHealthInput` (the CLI's sampler; the
agent builds the same input from its ring buffers).

``sleep`` is injected: real time on real GPUs, the simulator's manual clock in ``--sim`` runs
and tests, so a simulated window costs no wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample
from gpufleet.errors import DeviceError, GpuLostError
from gpufleet.health.context import GpuHealthInput, GpuWindow, NodeHealthInput


def collect_node(
    backend: GpuBackend,
    *,
    duration_s: float = 3.0,
    interval_s: float = 1.0,
    sleep: Callable[[float], object] = time.sleep,
    on_tick: Callable[[], object] | None = None,
) -> NodeHealthInput:
    """Sample every GPU of ``backend`` every ``interval_s`` for ``duration_s`` (at least one
    sweep; full samples, so slow-tier counters give rates), collect events, and read device
    info at the end (a PCIe link that retrains shows up)."""
    count = backend.device_count()
    samples: dict[int, list[Sample]] = {i: [] for i in range(count)}
    events: list[GpuEvent] = []
    first_info: dict[int, DeviceInfo] = {}
    for i in range(count):
        try:
            first_info[i] = backend.device_info(i)
        except (GpuLostError, DeviceError):
            continue
    sweeps = max(1, round(duration_s / interval_s) + 1) if duration_s > 0 else 1
    for n in range(sweeps):
        if n:
            sleep(interval_s)
        for i in range(count):
            if i in backend.lost_gpus():
                continue
            try:
                samples[i].append(backend.sample(i))
            except (GpuLostError, DeviceError):
                continue
        # NvmlBackend.poll_events resolves an event's UUID without naming the GPU, so the
        # XID of a GPU that just fell off the bus raises here; the loss itself is still
        # reported (lost_gpus, and a gpu_lost event on the next poll).
        with contextlib.suppress(DeviceError):
            events.extend(backend.poll_events())
        if on_tick is not None:
            on_tick()
    versions: dict[str, str | None] = {}
    system_versions = getattr(backend, "system_versions", None)
    if callable(system_versions):
        try:
            versions = dict(system_versions())
        except DeviceError:
            versions = {}
    gpus: list[GpuHealthInput] = []
    for i in range(count):
        info: DeviceInfo | None = first_info.get(i)
        if i not in backend.lost_gpus():
            try:
                info = backend.device_info(i)
            except (GpuLostError, DeviceError):
                info = None
        gpus.append(
            GpuHealthInput(
                index=i,
                uuid=info.uuid if info else None,
                info=info,
                window=GpuWindow.of(samples[i]),
                events=tuple(e for e in events if e.gpu_index == i),
                lost=i in backend.lost_gpus(),
            )
        )
    return NodeHealthInput(
        node=backend.node_name,
        gpus=tuple(gpus),
        driver_version=versions.get("driver_version"),
        nvml_version=versions.get("nvml_version"),
        cuda_driver_version=versions.get("cuda_driver_version"),
    )
