"""The two-tier sampler: a fast tier (default every 1 s) and a slow tier (default every 30 s)
over a `GpuBackend`, into per-GPU numeric ring buffers.

Each GPU's device work runs on that GPU's own lane (a worker thread of its own, or a lane of a
shared `CallPool` when many simulated nodes run in one process; `gpufleet.telemetry.workers`)
and the sampler waits for it at most ``call_timeout_s``: a hung NVML call
(``FaultKind.HUNG_CALL`` in the simulator) marks only that GPU *stalled*, and the GPU is skipped
(no new work queued behind the hung call) until the call returns. A lost GPU
(``GpuLostError``) is marked lost and the others keep sampling. Event polling runs on its own
lane under the same bound.

``tick(now)`` does one round and is what tests drive with a manual clock; the agent's real-time
loop calls it on schedule (`Sampler.next_due`).

The health rules' window: the last ``recent`` `Sample` objects per GPU (the agent on a real
node), or, with ``recent=0``, samples rebuilt from the ring buffers on demand (`window`), which
keeps a thousand simulated nodes in a few hundred KB each. ``close`` waits (bounded) for calls
still running before it shuts NVML down, and leaves NVML initialised when one hangs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample
from gpufleet.errors import GpuLostError
from gpufleet.telemetry.fields import FAST_COLUMNS, SLOW_COLUMNS, sample_row
from gpufleet.telemetry.metrics import MIG_COLUMNS
from gpufleet.telemetry.ring import RingBuffer
from gpufleet.telemetry.workers import CallJob, CallPool, Lane, ThreadLane

MIG_RING_ROWS = 120  # per MIG instance: two minutes at the default 1 s fast tier

log = logging.getLogger("gpufleet.telemetry.sampler")

DEFAULT_FAST_INTERVAL_S = 1.0
DEFAULT_SLOW_INTERVAL_S = 30.0
DEFAULT_CALL_TIMEOUT_S = 0.5
DEFAULT_FAST_CAPACITY = 600  # 10 minutes at 1 s
DEFAULT_SLOW_CAPACITY = 120  # 1 hour at 30 s
EVENT_HISTORY = 1024
DEFAULT_RECENT = 130  # Sample objects kept for health rules (~2 min at 1 s, plus slow ones)
DEFAULT_CLOSE_WAIT_S = 2.0  # how long `close` waits for device calls still running


@dataclass
class MigInstance:
    """A MIG GPU instance of a GPU: its id, profile name and its own small ring buffer."""

    gi_id: int
    profile: str
    ring: RingBuffer


@dataclass
class _Rebuilt:
    """Samples rebuilt from one ring's newest rows, and the ring count they reach."""

    ring: RingBuffer
    count: int
    samples: deque[Sample]

    def update(self, columns: tuple[str, ...]) -> deque[Sample]:
        """Append the rows the ring got since; the deque keeps only the window's rows."""
        t, rows, self.count = self.ring.since(self.count)
        keep = self.samples.maxlen or 0
        start = max(0, len(t) - keep)  # older rows would drop out of the deque at once
        self.samples.extend(
            row_sample(ts, row, columns) for ts, row in zip(t[start:], rows[start:], strict=True)
        )
        return self.samples


@dataclass
class GpuState:
    """Everything the sampler knows about one GPU; read under `Sampler.lock`."""

    index: int
    fast: RingBuffer
    slow: RingBuffer
    info: DeviceInfo | None = None
    lost: bool = False
    stalled: bool = False
    stalls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    xid_counts: Counter[int] = field(default_factory=Counter)
    last_xid: int | None = None
    mig: list[MigInstance] = field(default_factory=list)
    recent: deque[Sample] = field(default_factory=lambda: deque(maxlen=DEFAULT_RECENT))
    new_events: list[GpuEvent] = field(default_factory=list)
    # the health window rebuilt from the rings (``recent=0``), per ring: only rows appended
    # since the last tick become new `Sample` objects
    rebuilt: dict[str, _Rebuilt] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return self.info.uuid if self.info else f"unknown-{self.index}"


@dataclass(frozen=True)
class TickResult:
    """What one `Sampler.tick` did."""

    now: float
    fast: bool
    slow: bool
    sampled: tuple[int, ...]
    stalled: tuple[int, ...]
    lost: tuple[int, ...]
    events: tuple[GpuEvent, ...]
    duration_s: float


@dataclass
class _GpuResult:
    info: DeviceInfo | None
    fast: Sample | None
    slow: Sample | None
    mig: dict[int, tuple[str, dict[str, float]]] | None = None


class Sampler:
    """Samples one node's GPUs in two tiers into ring buffers; never raises from `tick`."""

    def __init__(
        self,
        backend: GpuBackend,
        *,
        fast_interval_s: float = DEFAULT_FAST_INTERVAL_S,
        slow_interval_s: float = DEFAULT_SLOW_INTERVAL_S,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        fast_capacity: int = DEFAULT_FAST_CAPACITY,
        slow_capacity: int = DEFAULT_SLOW_CAPACITY,
        recent: int = DEFAULT_RECENT,
        window_s: float = 130.0,
        clock: Callable[[], float] = time.time,
        calls: CallPool | None = None,
    ) -> None:
        if fast_interval_s <= 0 or slow_interval_s <= 0:
            raise ValueError("sampling intervals must be positive")
        self.backend = backend
        self.node = backend.node_name
        self.fast_interval_s = fast_interval_s
        self.slow_interval_s = slow_interval_s
        self.call_timeout_s = call_timeout_s
        self.clock = clock
        self.lock = threading.RLock()
        self._gpm = getattr(backend, "sample_gpm", None)
        count = backend.device_count()
        self.gpus: list[GpuState] = [
            GpuState(
                index=i,
                fast=RingBuffer(FAST_COLUMNS, fast_capacity),
                slow=RingBuffer(SLOW_COLUMNS, slow_capacity),
                recent=deque(maxlen=recent),
            )
            for i in range(count)
        ]
        self.window_s = window_s
        self._recent = recent
        self._workers: list[Lane] = [
            calls.lane() if calls is not None else ThreadLane(f"gpufleet-gpu{i}")
            for i in range(count)
        ]
        self._event_worker: Lane = (
            calls.lane() if calls is not None else ThreadLane("gpufleet-events")
        )
        self._event_job: CallJob | None = None
        self.events: deque[GpuEvent] = deque(maxlen=EVENT_HISTORY)
        self.events_total = 0
        self.event_errors = 0
        self.ticks = 0
        self.tick_errors = 0
        self.last_fast_s: float | None = None
        self.last_slow_s: float | None = None
        self.last_duration_s = 0.0
        self.duration_sum_s = 0.0
        self.last_tick_wall: float | None = None
        self.devices_version = (
            0  # bumped whenever a DeviceInfo is read for the first time or changed
        )

    # ----- schedule --------------------------------------------------------------------------
    def fast_due(self, now: float) -> bool:
        return self.last_fast_s is None or now - self.last_fast_s >= self.fast_interval_s - 1e-6

    def slow_due(self, now: float) -> bool:
        return self.last_slow_s is None or now - self.last_slow_s >= self.slow_interval_s - 1e-6

    def call_running_s(self, index: int) -> float | None:
        """How long GPU ``index``'s unfinished device call has been running (monotonic
        seconds); None when its lane is idle or the call has not started yet."""
        job = self._workers[index].current
        return job.running_for_s(time.monotonic()) if job is not None else None

    def next_due(self) -> float:
        """When the next fast round is due (clock seconds)."""
        if self.last_fast_s is None:
            return self.clock()
        return self.last_fast_s + self.fast_interval_s

    # ----- one round -------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickResult:
        """Sample every GPU that is due and not stalled, and poll events; bounded in time."""
        now = self.clock() if now is None else now
        started = time.perf_counter()
        try:
            return self._tick(now, started)
        except Exception:  # never crash the agent's loop
            self.tick_errors += 1
            log.exception("sampler tick failed")
            return TickResult(now, False, False, (), (), (), (), time.perf_counter() - started)

    def _tick(self, now: float, started: float) -> TickResult:
        fast = self.fast_due(now)
        slow = self.slow_due(now)
        jobs: dict[int, CallJob] = {}
        stalled: list[int] = []
        if fast or slow:
            for gpu, worker in zip(self.gpus, self._workers, strict=True):
                if gpu.lost:
                    continue
                if worker.busy:
                    stalled.append(gpu.index)
                    continue
                need_info = gpu.info is None
                # re-read the identity on the slow tier: PCIe link width/generation, power
                # limit, persistence, ECC and MIG modes change while the agent runs
                refresh = slow and not need_info
                mig = bool(fast and gpu.info is not None and gpu.info.mig_current)
                jobs[gpu.index] = worker.submit(
                    self._gpu_job(gpu.index, need_info, fast, slow, mig, refresh_info=refresh)
                )
        if self._event_job is None or self._event_job.done.is_set():
            self._event_job = self._event_worker.submit(self.backend.poll_events)
            event_job: CallJob | None = self._event_job
        else:
            event_job = None  # still stuck in the previous poll
        deadline = time.monotonic() + self.call_timeout_s
        for job in jobs.values():
            job.done.wait(max(0.0, deadline - time.monotonic()))
        if event_job is not None:
            event_job.done.wait(max(0.0, deadline - time.monotonic()))

        sampled: list[int] = []
        new_events: list[GpuEvent] = []
        with self.lock:
            for gpu in self.gpus:
                gpu.new_events = []
            for idx, job in jobs.items():
                gpu = self.gpus[idx]
                if not job.done.is_set():
                    if not gpu.stalled:
                        gpu.stalls += 1
                        log.warning("GPU %d on %s: NVML call did not return", idx, self.node)
                    gpu.stalled = True
                    stalled.append(idx)
                    continue
                gpu.stalled = False
                if job.error is not None:
                    self._record_error(gpu, job.error)
                    continue
                self._store(gpu, job.result)
                job.result = None  # stored in the rings; the lane keeps the job until the next
                sampled.append(idx)
            for idx in stalled:
                self.gpus[idx].stalled = True
            if event_job is not None and event_job.done.is_set():
                if event_job.error is not None:
                    self.event_errors += 1
                    log.warning("event poll failed: %s", event_job.error)
                else:
                    new_events = list(event_job.result or [])
                    event_job.result = None
                    self._store_events(new_events)
            if fast:
                self.last_fast_s = now
            if slow:
                self.last_slow_s = now
            self.ticks += 1
            duration = time.perf_counter() - started
            self.last_duration_s = duration
            self.duration_sum_s += duration
            self.last_tick_wall = time.monotonic()
            lost = tuple(g.index for g in self.gpus if g.lost)
        return TickResult(
            now=now,
            fast=fast,
            slow=slow,
            sampled=tuple(sampled),
            stalled=tuple(sorted(set(stalled))),
            lost=lost,
            events=tuple(new_events),
            duration_s=duration,
        )

    def _gpu_job(
        self,
        index: int,
        need_info: bool,
        fast: bool,
        slow: bool,
        mig: bool = False,
        *,
        refresh_info: bool = False,
    ) -> Callable[[], Any]:
        backend = self.backend
        gpm = self._gpm
        sample_mig = getattr(backend, "sample_mig", None) if mig else None

        def run() -> _GpuResult:
            info = backend.device_info(index) if need_info else None
            if refresh_info:
                try:
                    info = backend.device_info(index)
                except GpuLostError:
                    raise
                except Exception as exc:  # keep the identity we have; the samples still count
                    log.debug("GPU %d: device info refresh failed: %s", index, exc)
            fs = backend.sample_fast(index) if fast else None
            if fs is not None and gpm is not None:
                prof = gpm(index)
                if prof:
                    fs = replace(fs, extra={**fs.extra, **prof})
            ss = backend.sample_slow(index) if slow else None
            mig_values = sample_mig(index) if sample_mig is not None else None
            return _GpuResult(info, fs, ss, mig_values)

        return run

    def _record_error(self, gpu: GpuState, error: BaseException) -> None:
        if isinstance(error, GpuLostError):
            if not gpu.lost:
                log.error("GPU %d on %s is lost: %s", gpu.index, self.node, error)
            gpu.lost = True
            gpu.errors["gpu_lost"] += 1
            return
        kind = type(error).__name__
        gpu.errors[kind] += 1
        log.warning("GPU %d on %s: %s: %s", gpu.index, self.node, kind, error)

    def _store(self, gpu: GpuState, result: _GpuResult) -> None:
        if result.info is not None and result.info != gpu.info:
            gpu.info = result.info
            self.devices_version += 1  # the push sends the devices again
        if result.fast is not None:
            gpu.fast.append(result.fast.timestamp_s, sample_row(result.fast, FAST_COLUMNS))
            gpu.recent.append(result.fast)
        if result.slow is not None:
            gpu.slow.append(result.slow.timestamp_s, sample_row(result.slow, SLOW_COLUMNS))
            gpu.recent.append(result.slow)
        if result.mig is not None and result.fast is not None:
            self._store_mig(gpu, result.fast.timestamp_s, result.mig)

    def _store_mig(
        self, gpu: GpuState, t: float, values: dict[int, tuple[str, dict[str, float]]]
    ) -> None:
        """Append each MIG instance's readings to its own ring (instances come and go with
        re-partitioning: unknown ones are added, vanished ones dropped)."""
        by_id = {inst.gi_id: inst for inst in gpu.mig}
        kept: list[MigInstance] = []
        for gi_id, (profile, readings) in sorted(values.items()):
            inst = by_id.get(gi_id)
            if inst is None or inst.profile != profile:
                inst = MigInstance(gi_id, profile, RingBuffer(MIG_COLUMNS, MIG_RING_ROWS))
            row = np.full(len(MIG_COLUMNS), math.nan)
            for i, col in enumerate(MIG_COLUMNS):
                if col in readings:
                    row[i] = readings[col]
            inst.ring.append(t, row)
            kept.append(inst)
        gpu.mig = kept

    def _store_events(self, events: list[GpuEvent]) -> None:
        for ev in events:
            self.events.append(ev)
            self.events_total += 1
            if 0 <= ev.gpu_index < len(self.gpus):
                gpu = self.gpus[ev.gpu_index]
                gpu.new_events.append(ev)
                if ev.kind == "xid" and ev.xid is not None:
                    gpu.xid_counts[ev.xid] += 1
                    gpu.last_xid = ev.xid
                elif ev.kind == "gpu_lost":
                    gpu.lost = True

    # ----- readers ---------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        with self.lock:
            return [g.info for g in self.gpus if g.info is not None]

    def buffer_depth(self) -> int:
        """Rows held across every ring buffer of the node."""
        with self.lock:
            return sum(len(g.fast) + len(g.slow) for g in self.gpus)

    def healthy_age_s(self) -> float:
        """Seconds (monotonic) since the last completed tick; inf before the first."""
        if self.last_tick_wall is None:
            return math.inf
        return time.monotonic() - self.last_tick_wall

    def window(self, gpu: GpuState) -> tuple[Sample, ...]:
        """The samples the health rules see for ``gpu``, oldest first: the kept `Sample`
        objects, or (``recent=0``) the ring rows of the last ``window_s`` rebuilt as samples."""
        if self._recent > 0:
            return tuple(gpu.recent)
        out: list[Sample] = []
        for tier, ring, columns, interval in (
            ("fast", gpu.fast, FAST_COLUMNS, self.fast_interval_s),
            ("slow", gpu.slow, SLOW_COLUMNS, self.slow_interval_s),
        ):
            rows = min(math.ceil(self.window_s / interval) + 1, ring.capacity)
            cached = gpu.rebuilt.get(tier)
            if cached is None or cached.ring is not ring or cached.samples.maxlen != rows:
                cached = gpu.rebuilt[tier] = _Rebuilt(ring, 0, deque(maxlen=rows))
            out.extend(cached.update(columns))
        out.sort(key=_timestamp)
        return tuple(out)

    def close(self, *, wait_s: float = DEFAULT_CLOSE_WAIT_S, shutdown: bool = True) -> bool:
        """Stop the lanes, wait up to ``wait_s`` for device calls still running, then release
        the library (``backend.close()``: nvmlShutdown). When a call is still inside NVML after
        the wait, NVML is left initialised (shutting it down under a running call is undefined
        in the driver) and False is returned: a hung call never blocks exit."""
        lanes = [*self._workers, self._event_worker]
        for lane in lanes:
            lane.stop()
        deadline = time.monotonic() + wait_s
        for lane in lanes:
            job = lane.current
            if job is not None:
                job.done.wait(max(0.0, deadline - time.monotonic()))
        hung = sum(1 for lane in lanes if lane.busy)
        if hung:
            log.warning(
                "%s: %d NVML call(s) still running after %.1f s; NVML left initialised",
                self.node,
                hung,
                wait_s,
            )
            return False
        if shutdown:
            try:
                self.backend.close()
            except Exception as exc:  # closing must not raise on the way out
                log.warning("%s: closing the device backend failed: %s", self.node, exc)
        return True


def _timestamp(smp: Sample) -> float:
    return smp.timestamp_s


def _converter(type_text: str) -> Callable[[float], Any]:
    if "bool" in type_text:
        return bool
    if "int" in type_text:
        return int
    return float


# Sample field -> how a ring value (float64) becomes that field's type again
_FIELD_TYPES: dict[str, Callable[[float], Any]] = {
    f.name: _converter(str(f.type))
    for f in fields(Sample)
    if f.name not in ("timestamp_s", "extra")
}


def row_sample(t: float, row: np.ndarray, columns: tuple[str, ...]) -> Sample:
    """A ring-buffer row as the `Sample` it was stored from (NaN -> None, 0/1 -> bool, ints
    back to int, GPM ratios into ``extra``)."""
    values: dict[str, Any] = {}
    extra: dict[str, float] = {}
    for name, v in zip(columns, row.tolist(), strict=True):
        if v != v:  # NaN: the field had no value
            continue
        conv = _FIELD_TYPES.get(name)
        if conv is None:
            extra[name] = v
        else:
            values[name] = conv(v)
    return Sample(timestamp_s=float(t), extra=extra, **values)
