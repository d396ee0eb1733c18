"""The one writer of the control plane: a thread that owns every database write and the mutable
node cache.

API handlers, ingest and the background loop send it commands (callables) and wait for their
results; ingest batches that arrive together are stored in one transaction (group commit).
After each command or group the writer publishes a new immutable `Snapshot` of the node cache
(`ControlStore.publish`) before anyone learns the result, so whoever got an answer reads its
own write. Nothing that waits on anything but the database runs here: scheduler calls go to
`gpufleet.control.state.sched_calls`, and their answers come back as commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gpufleet.control.db.away import database_away, first_line, log_failure
from gpufleet.control.state.cache import IngestItem
from gpufleet.wire import Ack

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control.writer")
T = TypeVar("T")
Result = Ack | BaseException


class WriterStopped(RuntimeError):
    """The writer stopped before it ran a command or committed a batch queued for it."""


@dataclass(frozen=True)
class _Ingest:
    """One batch waiting for its group commit; ``loop``/``future``: an asyncio waiter, else
    ``done`` (a concurrent future) for a plain thread."""

    item: IngestItem
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[Ack] | None
    done: Future[Ack] | None


@dataclass(frozen=True)
class _Command:
    fn: Callable[[], object]
    done: Future[object]


class Writer:
    """The writer thread: commands run one at a time, in arrival order; ingest batches queued
    next to each other are committed together (up to ``max_group`` per transaction)."""

    def __init__(self, store: ControlStore, *, max_group: int = 256) -> None:
        self.store = store
        self.max_group = max_group
        self._q: queue.SimpleQueue[list[_Ingest] | _Ingest | _Command | None] = queue.SimpleQueue()
        # per event loop: batches awaiting the end of the loop's iteration (one hand-over each)
        self._held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Ingest]] = (
            weakref.WeakKeyDictionary()
        )
        self._held_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # queueing and stopping exclude each other: nothing is queued once stop drained the queue
        self._state_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._inline_lock = threading.RLock()  # one at a time while no writer thread runs
        self._queued_ingest = 0
        self.rate: deque[tuple[float, int]] = deque(maxlen=64)  # (monotonic, batches) per group

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpufleet-writer", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish what is queued, then end the thread. Whatever was queued behind the stop
        fails with `WriterStopped` (its caller would wait forever); later calls run inline."""
        t = self._thread
        if t is not None:
            self._q.put(None)
            t.join(timeout=timeout_s)
            with self._state_lock:
                self._thread = None
                self._fail_queued()

    def _fail_queued(self) -> None:
        exc = WriterStopped("the control plane's writer has stopped")
        while True:
            try:
                w = self._q.get_nowait()
            except queue.Empty:
                return
            for one in w if isinstance(w, list) else [w]:
                if isinstance(one, _Command):
                    one.done.set_exception(exc)
                elif isinstance(one, _Ingest):
                    self._count(-1)
                    self._resolve(one, exc)

    @staticmethod
    def _resolve(g: _Ingest, r: Result) -> None:
        """Hand one batch's result to whoever waits for it (a future on its event loop, or a
        concurrent future)."""
        if g.loop is not None and g.future is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed while the request waited
                g.loop.call_soon_threadsafe(_resolve_all, [(g.future, r)])
        elif g.done is not None:
            if isinstance(r, BaseException):
                g.done.set_exception(r)
            else:
                g.done.set_result(r)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _inline(self) -> bool:
        """Run here and now: the writer is not running (before start, after stop: tests and
        one-shot CLI commands), or this already is the writer thread."""
        t = self._thread
        return t is None or not t.is_alive() or threading.current_thread() is t

    @property
    def pending(self) -> int:
        """Ingest batches queued and not yet committed."""
        return self._queued_ingest

    def _count(self, n: int) -> None:
        with self._count_lock:
            self._queued_ingest += n

    # -- commands -------------------------------------------------------------------------------
    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` for the writer; its result (or exception) arrives in the future."""
        fut: Future[T] = Future()
        with self._state_lock:
            inline = self._inline()
            if not inline:
                self._q.put(_Command(fn, fut))  # type: ignore[arg-type]
        if inline:
            with self._inline_lock:
                self._execute(_Command(fn, fut))  # type: ignore[arg-type]
        return fut

    def call(self, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """Run ``fn`` on the writer and wait for its result (from a plain thread, never from
        the event loop: use `run` there)."""
        return self.submit(fn).result(timeout_s)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the writer and await its result (from the event loop)."""
        return await asyncio.wrap_future(self.submit(fn))

    # -- ingest ---------------------------------------------------------------------------------
    async def ingest(self, item: IngestItem) -> Ack:
        """Queue one batch and await its group's commit."""
        if self._inline():
            with self._inline_lock:
                return _unwrap(self._apply([item])[0])
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Ack] = loop.create_future()
        self._count(1)
        held = self._held.get(loop)
        if held is None:
            with self._held_lock:
                held = self._held.setdefault(loop, [])
        if not held:  # the first of this loop iteration: hand them over at its end, together
            loop.call_soon(self._hand_over, held)
        held.append(_Ingest(item, loop, fut, None))
        return await fut

    def _hand_over(self, held: list[_Ingest]) -> None:
        batch = held[:]
        held.clear()
        with self._state_lock:
            if self._thread is not None:
                self._q.put(batch)
                return
        for g in batch:  # the writer stopped while these waited for the end of the iteration
            self._count(-1)
            self._resolve(g, WriterStopped("the control plane's writer has stopped"))

    def ingest_sync(self, item: IngestItem, timeout_s: float = 60.0) -> Ack:
        """The same from a plain thread (in-process agents, tests)."""
        done: Future[Ack] = Future()
        with self._state_lock:
            inline = self._inline()
            if not inline:
                self._count(1)
                self._q.put(_Ingest(item, None, None, done))
        if inline:
            with self._inline_lock:
                return _unwrap(self._apply([item])[0])
        return done.result(timeout_s)

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._q.get()
            if first is None:
                return
            work: list[_Ingest | _Command] = []
            nxt: list[_Ingest] | _Ingest | _Command = first
            while True:
                if isinstance(nxt, list):
                    work.extend(nxt)
                else:
                    work.append(nxt)
                if len(work) >= 4 * self.max_group:
                    break
                try:
                    more = self._q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                nxt = more
            group: list[_Ingest] = []
            for w in work:
                if isinstance(w, _Ingest):
                    group.append(w)
                    if len(group) >= self.max_group:
                        self._commit(group)
                        group = []
                    continue
                if group:
                    self._commit(group)
                    group = []
                self._execute(w)
            if group:
                self._commit(group)

    def _execute(self, cmd: _Command) -> None:
        """Run one command; whatever fails (the command, the cache reload after it, the
        snapshot), its caller gets the error and the writer thread lives on."""
        try:
            self.store.reload_if_due()
        except BaseException as exc:  # the database still away: not run on a doubtful cache
            self._outcome(exc)
            cmd.done.set_exception(exc)
            return
        try:
            out = cmd.fn()
        except BaseException as exc:
            self._outcome(exc)
            for recover in (self.store.after_failure, lambda _e: self.store.publish()):
                try:
                    recover(exc)
                except Exception as exc2:  # e.g. the database is down: the next command retries
                    log_failure(log, "writer: recovering from a failed command failed", exc2)
            cmd.done.set_exception(exc)
            return
        try:
            self.store.publish()
        except Exception as exc:
            cmd.done.set_exception(exc)
            return
        cmd.done.set_result(out)

    def _outcome(self, exc: BaseException | None) -> None:
        """Tell the store's outage tracker (`DatabaseOutage`) how a database operation went:
        failed with the database away, or done (``None``: only where it surely reached the
        database, a group commit; a command that succeeds may have read only the cache). Other
        failures say nothing either way."""
        if exc is None:
            self.store.outage.ok()
        elif database_away(exc):
            self.store.outage.failed()

    def _apply(self, items: list[IngestItem]) -> list[Result]:
        """Store ``items`` in one transaction; a broken group is retried one batch at a time
        so one bad batch fails alone. Publishes the snapshot before returning."""
        results: list[Result]
        try:
            self.store.reload_if_due()
        except Exception as exc:  # the database still away: every batch waits for a retry
            self._outcome(exc)
            return [exc for _ in items]
        try:
            results = list(self.store.apply_batches(items))
        except Exception as exc:
            log.warning(
                "group commit of %d batches failed (%s); retrying singly",
                len(items),
                first_line(exc),
            )
            results = []
            for item in items:
                try:
                    self.store.reload_if_due()  # the group's rebuild may have failed too
                    results.extend(self.store.apply_batches([item]))
                except Exception as exc1:
                    results.append(exc1)
        away = [r for r in results if isinstance(r, BaseException) and database_away(r)]
        if away or any(not isinstance(r, BaseException) for r in results):
            self._outcome(away[0] if away else None)
        self.store.publish()
        return results

    def _commit(self, group: list[_Ingest]) -> None:
        results = self._apply([g.item for g in group])
        self._count(-len(group))
        self.rate.append((time.monotonic(), len(group)))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Ack], Result]]] = {}
        for g, r in zip(group, results, strict=True):
            if g.loop is not None and g.future is not None:
                by_loop.setdefault(g.loop, []).append((g.future, r))
            elif g.done is not None:
                if isinstance(r, BaseException):
                    g.done.set_exception(r)
                else:
                    g.done.set_result(r)
        for loop, pairs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # its loop closed while the request waited
                loop.call_soon_threadsafe(_resolve_all, pairs)


def _resolve_all(pairs: list[tuple[asyncio.Future[Ack], Result]]) -> None:
    for fut, r in pairs:
        if fut.done():
            continue
        if isinstance(r, BaseException):
            fut.set_exception(r)
        else:
            fut.set_result(r)


def _unwrap(r: Result) -> Ack:
    if isinstance(r, BaseException):
        raise r
    return r
