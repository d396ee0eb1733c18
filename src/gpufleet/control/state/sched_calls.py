"""Every call from the control plane into the plugged-in scheduler, on worker threads of its
own: never on the event loop, never on the writer, never under a lock.

The lifecycle's drain/resume/lost calls go, after the snapshot that holds the transition is
published, to the store's `gpufleet.control.state.ports.SchedulerHook` (the scheduler's events,
whose own thread runs them against the backend in commit order). Two more lanes, one daemon thread
each, so a slow answer on one does not hold up the others:

- ``ask``: ``is_idle`` for draining nodes whose drain the backend confirmed; the answer
  returns to the writer as a command;
- ``exchange``: the agents' job reports and commands. Ingest never waits for it: the commands a
  report produces wait in a per-node outbox and ride on that node's next ``Ack``.

A backend that cannot answer (`NoScheduler`, or one whose ``capabilities()`` lack the feature)
is answered here at once, without a thread.
This module is the only place that calls the scheduler from the control plane's core.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from gpufleet.control.state.ports import SchedulerHook
from gpufleet.wire import Batch, WireCommand

log = logging.getLogger("gpufleet.control.scheduler")
Submit = Callable[[Callable[[], Any]], Future[Any]]


class _Lane:
    """One daemon thread running queued calls in order (a hung call blocks only its lane and
    never the process's exit)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._q.put(fn)

    def stop(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._q.put(None)
                self._thread = None

    def _run(self) -> None:
        while (fn := self._q.get()) is not None:
            try:
                fn()
            except Exception:
                log.exception("scheduler call on %s failed", self.name)


class SchedulerCalls:
    """The control plane's calls into the scheduler; ``events()`` gives the store's scheduler
    port."""

    def __init__(self, events: Callable[[], SchedulerHook], submit: Submit) -> None:
        self._events = events
        self._submit = submit
        self._ask = _Lane("gpufleet-sched-ask")
        self._exchange = _Lane("gpufleet-sched-exchange")
        self._lock = threading.Lock()  # guards the two dicts below, nothing else
        self._asking: set[str] = set()
        self._outbox: dict[str, list[WireCommand]] = {}

    def stop(self) -> None:
        for lane in (self._ask, self._exchange):
            lane.stop()

    # -- lifecycle ------------------------------------------------------------------------------
    def notify(self, calls: list[Callable[[], None]]) -> None:
        """Run the post-commit calls of a transaction, in order; a failure is logged. They only
        queue work on the scheduler events' thread (inline before it starts), so they run here."""
        for fn in calls:
            _logged(fn)()

    def idle(self, node: str, since_s: float, then: Callable[[str, float, bool], None]) -> bool:
        """Is ``node`` idle? False until the backend confirmed its drain; then True at once
        for a backend that cannot tell (``min_drain_s`` decides); otherwise the scheduler is
        asked on the ask lane (once at a time per node) and ``then(node, since_s, answer)``
        runs later on the writer."""
        events = self._events()
        if not events.drain_confirmed(node):  # queued, failed (queued again) or never sent
            return False
        if not events.reports_idle:  # the backend cannot tell: min_drain_s decides
            return True
        with self._lock:
            if node in self._asking:
                return False
            self._asking.add(node)

        def ask() -> None:
            try:
                answer = bool(events.is_idle(node))
            except Exception as exc:
                log.warning("scheduler is_idle(%s) failed: %s", node, exc)
                answer = False
            finally:
                with self._lock:
                    self._asking.discard(node)
            self._submit(lambda: then(node, since_s, answer)).add_done_callback(_log_failure)

        self._ask.put(ask)
        return False

    # -- agents' exchange -----------------------------------------------------------------------
    def deliver(self, node: str, cmds: list[WireCommand]) -> None:
        """Commands the scheduler has for ``node`` now (a kill after a fail drain, a start):
        they ride on the node's next ``Ack`` (``SchedulerContext.deliver``)."""
        with self._lock:
            self._outbox.setdefault(node, []).extend(cmds)

    def exchange(self, batch: Batch, now_s: float) -> list[WireCommand]:
        """Hand the batch's job report to the scheduler and return the commands waiting for
        this node (from its earlier reports); nothing when the backend runs no agent jobs."""
        events = self._events()
        if not events.runs_agent_jobs:
            return []
        node = batch.node

        def run() -> None:
            cmds = events.exchange(batch, now_s)
            if cmds:
                with self._lock:
                    self._outbox.setdefault(node, []).extend(cmds)

        self._exchange.put(run)
        with self._lock:
            return self._outbox.pop(node, [])


def _log_failure(fut: Future[Any]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("applying a scheduler answer failed: %s", exc)


def _logged(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as exc:
            log.warning("scheduler hook failed: %s", exc)

    return run
