"""Per-call deadlines for the commands that read GPUs (status, health, inventory, doctor,
validate): a GPU whose NVML calls hang costs one deadline, not the command.

`DeadlineBackend` wraps any `GpuBackend`. Each GPU's calls run one at a time on that GPU's own
daemon thread (node-wide calls on another, event polling on a third) and the caller waits at
most ``timeout_s``. A call past its deadline raises `NvmlTimeoutError` ("GPU 7 did not answer
NVML within 5 s"); the GPU is then marked unresponsive and every later call on it fails at once,
so nothing queues behind a hung call and a command's wall time is bounded by one deadline per
lane, whatever the number of hung GPUs (`each` waits on all GPUs together). A hung thread is a
daemon: it never blocks the process from exiting.

The deadline counts from the moment a call *starts* on its lane, not from when it was asked
for: on a starved machine (CPU load many times the core count) a lane thread may wait seconds
before it runs at all, and a call that never started has not hung (`verdict`). Under
`stress-ng` such waits made healthy simulated GPUs "not answer within 5 s". A call queued
behind another call that is itself past the deadline is hung with it.

The agent has its own lanes (``gpufleet.telemetry.workers``); this is the same idea for
one-shot commands, kept in the device layer so every command can use it.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.types import DeviceInfo, GpuEvent, Sample
from gpufleet.errors import DeviceError

NVML_TIMEOUT_S = 5.0
_NODE = "node"
_EVENTS = "events"
_T = TypeVar("_T")


class NvmlTimeoutError(DeviceError):
    """A GPU (or the node's NVML) did not answer within the deadline."""

    def __init__(self, message: str, *, gpu: int | None) -> None:
        super().__init__(message)
        self.gpu = gpu


class _Call:
    __slots__ = ("done", "error", "fn", "result", "started")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started: float | None = None  # time.monotonic() when the lane began running it


def verdict(now: float, timeout_s: float, started: float | None, lane_since: float | None) -> float:
    """Whether a call not yet done has hung: 0 when it has (it has run ``timeout_s`` since
    ``started``, or it never started and the call holding its lane has run that long since
    ``lane_since``); else how many more seconds to wait before asking again (a call that never
    started, behind no hung call, was starved of CPU: it gets another deadline)."""
    if started is not None:
        return max(0.0, started + timeout_s - now)
    if lane_since is not None and now - lane_since >= timeout_s:
        return 0.0
    return timeout_s


class _Lane:
    """One daemon thread running one call at a time; ``running`` is the call it runs now."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.running: _Call | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _take(self) -> _Call | None:
        return self._q.get()

    def _run(self) -> None:
        while True:
            call = self._take()
            if call is None:
                return
            call.started = time.monotonic()
            self.running = call
            try:
                call.result = call.fn()
            except BaseException as exc:  # handed to the caller, never raised on this thread
                call.error = exc
            finally:
                self.running = None
                call.done.set()

    def submit(self, fn: Callable[[], Any]) -> _Call:
        call = _Call(fn)
        self._q.put(call)
        return call

    def stop(self) -> None:
        self._q.put(None)


Key = int | str


class DeadlineBackend:
    """A `GpuBackend` whose every call has a deadline (see the module docstring)."""

    def __init__(
        self,
        inner: GpuBackend,
        timeout_s: float = NVML_TIMEOUT_S,
        lane: Callable[[str], _Lane] = _Lane,
    ) -> None:
        self.inner = inner
        self._new_lane = lane
        self.node_name = inner.node_name
        self.timeout_s = timeout_s
        self._lanes: dict[Key, _Lane] = {}
        self._unresponsive: dict[Key, str] = {}
        self._events: list[GpuEvent] = []  # fetched by `each`, not yet handed out
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # attributes that make no NVML call (``_lib``, ...)

    # ----- the deadline --------------------------------------------------------------------
    def _message(self, key: Key) -> str:
        if isinstance(key, int):
            return f"GPU {key} did not answer NVML within {self.timeout_s:g} s"
        return f"NVML on {self.node_name} did not answer within {self.timeout_s:g} s ({key})"

    def _submit(self, key: Key, fn: Callable[[], Any]) -> _Call:
        with self._lock:
            message = self._unresponsive.get(key)
            if message is not None:
                raise NvmlTimeoutError(message, gpu=key if isinstance(key, int) else None)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = self._new_lane(f"nvml-{self.node_name}-{key}")
            return lane.submit(fn)

    def _result(self, key: Key, call: _Call, deadline: float) -> Any:
        """``call``'s result; waits until ``deadline`` and then for as long as `verdict` says
        the call has not hung (it started late, or has not started behind no hung call)."""
        wait_s = max(0.0, deadline - time.monotonic())
        while not call.done.wait(wait_s):
            with self._lock:
                lane = self._lanes.get(key)
            blocker = lane.running if lane is not None else None
            lane_since = blocker.started if blocker is not None and blocker is not call else None
            wait_s = verdict(time.monotonic(), self.timeout_s, call.started, lane_since)
            if wait_s <= 0.0 and not call.done.is_set():
                with self._lock:
                    self._unresponsive.setdefault(key, self._message(key))
                gpu = key if isinstance(key, int) else None
                raise NvmlTimeoutError(self._message(key), gpu=gpu)
        if call.error is not None:
            raise call.error
        return call.result

    def run(self, key: Key, fn: Callable[[], Any]) -> Any:
        """``fn()`` on ``key``'s lane (a GPU index, or a node-wide lane name), within the
        deadline."""
        call = self._submit(key, fn)
        return self._result(key, call, time.monotonic() + self.timeout_s)

    def gather(self, calls: dict[Key, Callable[[], Any]]) -> dict[Key, Any]:
        """Each call on its own lane, all started at once and waited for within one deadline:
        a result or the exception each raised (`NvmlTimeoutError` for those past it)."""
        started: dict[Key, _Call | BaseException] = {}
        for key, fn in calls.items():
            try:
                started[key] = self._submit(key, fn)
            except NvmlTimeoutError as exc:
                started[key] = exc
        deadline = time.monotonic() + self.timeout_s
        out: dict[Key, Any] = {}
        for key, call in started.items():
            if isinstance(call, BaseException):
                out[key] = call
                continue
            try:
                out[key] = self._result(key, call, deadline)
            except Exception as exc:
                out[key] = exc
        return out

    def each(
        self, method: str, indexes: Iterable[int], *, poll_events: bool = False
    ) -> dict[int, Any]:
        """``inner.<method>(i)`` for every GPU at once within one deadline; with
        ``poll_events``, the node's event poll runs alongside (the first poll registers every
        GPU, so a hung one would stall it) and its events wait for `poll_events`."""
        fn = getattr(self.inner, method)
        calls: dict[Key, Callable[[], Any]] = {i: functools.partial(fn, i) for i in indexes}
        if poll_events:
            calls[_EVENTS] = functools.partial(self.inner.poll_events, 0)
        out = self.gather(calls)
        polled = out.pop(_EVENTS, None)
        if isinstance(polled, list):
            with self._lock:
                self._events.extend(polled)
        return {k: v for k, v in out.items() if isinstance(k, int)}

    def unresponsive(self) -> dict[int, str]:
        """GPUs that missed a deadline, with the message saying so."""
        with self._lock:
            return {k: m for k, m in self._unresponsive.items() if isinstance(k, int)}

    # ----- GpuBackend ------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self.run(_NODE, self.inner.device_count))

    def _on_gpu(self, fn: Callable[[int], _T], index: int) -> _T:
        """``fn(index)`` on GPU ``index``'s lane, within the deadline."""
        result: _T = self.run(index, functools.partial(fn, index))
        return result

    def device_info(self, index: int) -> DeviceInfo:
        return self._on_gpu(self.inner.device_info, index)

    def sample_fast(self, index: int) -> Sample:
        return self._on_gpu(self.inner.sample_fast, index)

    def sample_slow(self, index: int) -> Sample:
        return self._on_gpu(self.inner.sample_slow, index)

    def sample(self, index: int) -> Sample:
        return self._on_gpu(self.inner.sample, index)

    def running_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        lister = getattr(self.inner, "running_processes", None)
        if lister is None:
            return None
        procs: list[tuple[int, int | None]] | None = self._on_gpu(lister, index)
        return procs

    def system_versions(self) -> dict[str, str | None]:
        versions = getattr(self.inner, "system_versions", None)
        if versions is None:
            return {}
        out: dict[str, str | None] = self.run(_NODE, versions)
        return out

    def poll_events(self, timeout_ms: int = 0) -> list[GpuEvent]:
        """Events an `each` poll already fetched, then a new poll (within the deadline)."""
        with self._lock:
            events, self._events = self._events, []
        try:
            polled: list[GpuEvent] = self.run(_EVENTS, lambda: self.inner.poll_events(timeout_ms))
        except DeviceError:
            if events:
                return events
            raise
        return [*events, *polled]

    def lost_gpus(self) -> frozenset[int]:
        return self.inner.lost_gpus()

    def problems(self) -> list[str]:
        return [*self.inner.problems(), *self.unresponsive().values()]

    def close(self) -> None:
        """Release the library unless a call is still hung in it (then leave it to exit)."""
        with self._lock:
            hung = bool(self._unresponsive)
        if not hung:
            with contextlib.suppress(NvmlTimeoutError):
                self.run(_NODE, self.inner.close)
        self.release()

    def release(self) -> None:
        """Stop the lane threads (a hung one ends when its call returns); the wrapped backend
        stays open."""
        with self._lock:
            lanes = list(self._lanes.values())
            self._lanes.clear()
        for lane in lanes:
            lane.stop()


def with_deadlines(backend: GpuBackend, timeout_s: float = NVML_TIMEOUT_S) -> DeadlineBackend:
    """``backend`` with per-call deadlines (itself when it already has them)."""
    if isinstance(backend, DeadlineBackend):
        return backend
    return DeadlineBackend(backend, timeout_s)
