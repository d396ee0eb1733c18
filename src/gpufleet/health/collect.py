"""Read one node's GPUs for a short window into a `NodeHealthInput` (the CLI's sampler; the
agent builds the same input from its ring buffers).

``sleep`` and ``clock`` are injected: real time on real GPUs, the simulator's manual clock in
``--sim`` runs and tests, so a simulated window costs no wall time.

Every NVML call has a deadline (`gpufleet.devices.deadline`): the GPUs are read together, each on
its own thread, so a GPU whose calls hang costs one deadline (``nvml_timeout_s``) whatever the
number of hung GPUs, and becomes an ``nvml_timeout`` event ("GPU 7 did not answer NVML within
5 s"), which the health rules turn into a fail finding.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.deadline import NVML_TIMEOUT_S, DeadlineBackend, with_deadlines
from gpufleet.devices.types import GpuEvent, Sample
from gpufleet.errors import DeviceError
from gpufleet.health.context import GpuHealthInput, GpuWindow, NodeHealthInput


def collect_node(
    backend: GpuBackend,
    *,
    duration_s: float = 3.0,
    interval_s: float = 1.0,
    sleep: Callable[[float], object] = time.sleep,
    on_tick: Callable[[], object] | None = None,
    clock: Callable[[], float] = time.time,
    nvml_timeout_s: float = NVML_TIMEOUT_S,
) -> NodeHealthInput:
    """Sample every GPU of ``backend`` every ``interval_s`` for ``duration_s`` (at least one
    sweep; full samples, so slow-tier counters give rates), collect events, and read device
    info at the end (a PCIe link that retrains shows up)."""
    bounded = with_deadlines(backend, nvml_timeout_s)
    try:
        return _collect(bounded, duration_s, interval_s, sleep, on_tick, clock)
    finally:
        if bounded is not backend:
            bounded.release()


def _collect(
    bounded: DeadlineBackend,
    duration_s: float,
    interval_s: float,
    sleep: Callable[[float], object],
    on_tick: Callable[[], object] | None,
    clock: Callable[[], float],
) -> NodeHealthInput:
    count = bounded.device_count()
    samples: dict[int, list[Sample]] = {i: [] for i in range(count)}
    events: list[GpuEvent] = []
    # The first event poll registers every GPU for events, so it runs alongside the first
    # reads (a hung GPU stalls it too: one shared deadline, not two in a row).
    first = bounded.each("device_info", range(count), poll_events=True)
    first_info = {i: v for i, v in first.items() if _ok(v)}
    sweeps = max(1, round(duration_s / interval_s) + 1) if duration_s > 0 else 1
    for n in range(sweeps):
        if n:
            sleep(interval_s)
        readable = [i for i in range(count) if i not in bounded.lost_gpus()]
        for i, value in bounded.each("sample", readable).items():
            if _ok(value):
                samples[i].append(value)
        # NvmlBackend.poll_events resolves an event's UUID without naming the GPU, so the
        # XID of a GPU that just fell off the bus raises here; the loss itself is still
        # reported (lost_gpus, and a gpu_lost event on the next poll).
        with contextlib.suppress(DeviceError):
            events.extend(bounded.poll_events())
        if on_tick is not None:
            on_tick()
    versions: dict[str, str | None] = {}
    with contextlib.suppress(DeviceError):
        versions = dict(bounded.system_versions())
    readable = [i for i in range(count) if i not in bounded.lost_gpus()]
    last_info = {i: v for i, v in bounded.each("device_info", readable).items() if _ok(v)}
    now = clock()
    for i, message in sorted(bounded.unresponsive().items()):
        info = last_info.get(i) or first_info.get(i)
        events.append(GpuEvent(i, info.uuid if info else None, "nvml_timeout", now, detail=message))
    gpus: list[GpuHealthInput] = []
    for i in range(count):
        info = last_info.get(i) or (first_info.get(i) if i in bounded.lost_gpus() else None)
        if i in bounded.unresponsive():
            info = first_info.get(i)
        gpus.append(
            GpuHealthInput(
                index=i,
                uuid=info.uuid if info else None,
                info=info,
                window=GpuWindow.of(samples[i]),
                events=tuple(e for e in events if e.gpu_index == i),
                lost=i in bounded.lost_gpus(),
            )
        )
    return NodeHealthInput(
        node=bounded.node_name,
        gpus=tuple(gpus),
        driver_version=versions.get("driver_version"),
        nvml_version=versions.get("nvml_version"),
        cuda_driver_version=versions.get("cuda_driver_version"),
    )


def _ok(value: object) -> bool:
    """A GPU's answer was a reading; a device error (lost, hung) is not; any other exception
    is a bug and is raised."""
    if isinstance(value, BaseException) and not isinstance(value, DeviceError):
        raise value
    return not isinstance(value, BaseException)
