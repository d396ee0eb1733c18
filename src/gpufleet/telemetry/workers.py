"""Where a sampler's device calls run, so that a hung NVML call blocks only its own GPU.

A `Lane` runs one call at a time for one GPU (or for a node's event polling) and says whether
its last call is still running. Two kinds:

- `ThreadLane`: a dedicated daemon thread per lane (the agent on a real node: nine threads for
  eight GPUs);
- `CallPool.lane()`: lanes sharing a small pool of threads (many simulated nodes in one process,
  `gpufleet.agent.fleet`). A call that runs longer than ``stuck_after_s`` no longer counts as
  a worker: the pool starts another thread in its place (up to ``max_threads``), so hung calls
  on some GPUs never starve the others; extra threads exit once idle.

The sampler never queues a second call behind a busy lane, so a hung call holds one thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol


class Done:
    """A one-shot flag to wait on (a lock held until set): what ``threading.Event`` does for a
    single waiter, in a tenth of the memory (a sampler holds one per GPU)."""

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._lock.release()  # let any other waiter through too
        return self._flag


class CallJob:
    """One call handed to a lane: its result or error once ``done`` is set; ``started_s``
    (``time.monotonic()``) once a thread began running it: a call waiting for a thread (a
    starved machine, a busy pool) has not started, so it cannot have hung."""

    __slots__ = ("done", "error", "fn", "result", "started_s")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = Done()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_s: float | None = None

    def running_for_s(self, now: float) -> float | None:
        """Seconds this call has run by ``now`` (monotonic) while not done; None when it is
        done or has not started."""
        started = self.started_s
        if started is None or self.done.is_set():
            return None
        return now - started

    def run(self) -> None:
        self.started_s = time.monotonic()
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported to the sampler, never raised on the worker
            self.error = exc
        finally:
            self.fn = _done  # drop the closure (and what it holds) once it ran
            self.done.set()


def _done() -> None:
    return None


class Lane(Protocol):
    """Runs one call at a time; ``current`` is the last call submitted."""

    current: CallJob | None

    @property
    def busy(self) -> bool: ...

    def submit(self, fn: Callable[[], Any]) -> CallJob: ...

    def stop(self) -> None: ...


class _LaneBase:
    """What both lanes share: the last call and whether it still runs."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: CallJob | None = None

    @property
    def busy(self) -> bool:
        job = self.current
        return job is not None and not job.done.is_set()

    def submit(self, fn: Callable[[], Any]) -> CallJob:
        job = CallJob(fn)
        self.current = job
        self._enqueue(job)
        return job

    def _enqueue(self, job: CallJob) -> None:
        raise NotImplementedError


class ThreadLane(_LaneBase):
    """A lane with its own daemon thread."""

    __slots__ = ("_q", "_thread")

    def __init__(self, name: str) -> None:
        super().__init__()
        self._q: queue.SimpleQueue[CallJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _enqueue(self, job: CallJob) -> None:
        self._q.put(job)

    def stop(self) -> None:
        self._q.put(None)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            job.run()


class PooledLane(_LaneBase):
    """A lane whose calls run on a `CallPool`'s threads."""

    __slots__ = ("pool",)

    def __init__(self, pool: CallPool) -> None:
        super().__init__()
        self.pool = pool

    def _enqueue(self, job: CallJob) -> None:
        self.pool.submit(job)

    def stop(self) -> None:
        return None  # the pool's threads belong to the pool


class _PoolThread:
    __slots__ = ("busy_since", "extra")

    def __init__(self, extra: bool) -> None:
        self.busy_since: float | None = None
        self.extra = extra


class CallPool:
    """A few threads shared by many lanes; replaces threads stuck in hung calls."""

    def __init__(
        self,
        threads: int = 4,
        *,
        max_threads: int = 256,
        stuck_after_s: float = 1.0,
        idle_exit_s: float = 5.0,
        name: str = "gpufleet-calls",
    ) -> None:
        if threads < 1 or max_threads < threads:
            raise ValueError("threads must be >= 1 and max_threads >= threads")
        self.threads = threads
        self.max_threads = max_threads
        self.stuck_after_s = stuck_after_s
        self.idle_exit_s = idle_exit_s
        self.name = name
        self._q: queue.SimpleQueue[CallJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_PoolThread] = []
        self._closed = False
        self.spawned = 0
        for _ in range(threads):
            self._spawn(extra=False)

    def lane(self) -> PooledLane:
        return PooledLane(self)

    @property
    def size(self) -> int:
        """Threads alive now (stuck ones included)."""
        with self._lock:
            return len(self._workers)

    def stuck(self) -> int:
        """Threads inside a call that has run longer than ``stuck_after_s``."""
        with self._lock:
            return self._stuck_locked()

    def submit(self, job: CallJob) -> None:
        if self._closed:
            raise RuntimeError("call pool is closed")
        self._q.put(job)
        with self._lock:
            if (
                len(self._workers) - self._stuck_locked() < self.threads
                and len(self._workers) < self.max_threads
            ):
                self._spawn(extra=True)

    def _spawn(self, extra: bool) -> None:
        w = _PoolThread(extra)
        self._workers.append(w)
        self.spawned += 1
        t = threading.Thread(
            target=self._run, args=(w,), name=f"{self.name}-{self.spawned}", daemon=True
        )
        t.start()

    def _run(self, w: _PoolThread) -> None:
        try:
            while True:
                try:
                    job = self._q.get(timeout=self.idle_exit_s if w.extra else None)
                except queue.Empty:
                    # An extra thread leaves once the pool is whole again; it leaves the list in
                    # the same critical section as the check, so two idle extras never both see
                    # "one too many" and leave the pool short.
                    with self._lock:
                        if len(self._workers) - self._stuck_locked() > self.threads:
                            self._workers.remove(w)
                            return
                    continue
                if job is None:
                    return
                w.busy_since = time.monotonic()
                job.run()
                w.busy_since = None
        finally:
            with self._lock:
                if w in self._workers:
                    self._workers.remove(w)

    def _stuck_locked(self) -> int:
        now = time.monotonic()
        return sum(
            1
            for w in self._workers
            if w.busy_since is not None and now - w.busy_since > self.stuck_after_s
        )

    def close(self) -> None:
        """Ask every thread to exit after its current call (a hung one exits when it returns)."""
        self._closed = True
        with self._lock:
            n = len(self._workers)
        for _ in range(n):
            self._q.put(None)
