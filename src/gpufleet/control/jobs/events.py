"""How the control plane's node lifecycle reaches its scheduler backend (`SchedulerEvents`).

The backend (any `gpufleet.schedulers.base.SchedulerBackend`, chosen by name in
`gpufleet.schedulers.registry`) is handed to `ControlService` at construction. Transitions call
``drain``/``resume``/``lost`` here after they committed; this class decides whether a drain is for
a failure (a fail finding, or the node sent to repair/failed: its jobs move now) and runs the
backend's call on one scheduler thread, in order, so a slow ``scontrol`` or Kubernetes API call
never runs on the ingest path. Until ``start`` (unit tests driving ``tick()`` by hand) calls run
inline. A failed call is logged and recorded in ``done``; it never undoes the transition.

A drain completes only once the backend confirmed it: `drain_confirmed` is False while the
backend's drain is queued or after it failed (then it is queued again, at most every
``RETRY_DRAIN_S``), and a node this process never drained (a controller restart mid-drain) is
drained again first, so a dead or slow scheduler can never let a node that still takes work
count as drained.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.control.state.lifecycle import NodeState
from gpufleet.control.state.remediation import BLOCKED_REASON, blocked_drain
from gpufleet.errors import GpufleetError
from gpufleet.schedulers.base import Evacuation, Feature, NodeFacts, SchedulerBackend
from gpufleet.wire import Batch, WireCommand

if TYPE_CHECKING:
    from gpufleet.control.state.store import ControlStore

log = logging.getLogger("gpufleet.control.scheduling")
RETRY_DRAIN_S = 10.0  # a failed backend drain is sent again no sooner than this

Call = tuple[str, str, Callable[[], None]]


def fail_drain(store: ControlStore, node: str) -> bool:
    """Is this drain for a failure (a fail finding, or the node sent to repair/failed)?"""
    nc = store.view.nodes.get(node)  # the writer's snapshot (this runs off the writer)
    if nc is None:
        return False
    if nc.state in (NodeState.REPAIR.value, NodeState.FAILED.value):
        return True
    return any(f.severity >= 2 for f in nc.findings.values())


def node_facts(store: ControlStore, node: str) -> NodeFacts | None:
    """What a scheduler may know of a node: usable, why not, rack, tenant. Usable means in
    service, not cordoned and without an active fail finding (a lost GPU is one), whatever the
    circuit breaker says: a drain it blocked leaves the node in service, never fit for new
    work."""
    view = store.view  # the writer's snapshot (this runs off the writer)
    nc = view.nodes.get(node)
    if nc is None:
        return None
    fails = sorted(k[0] for k, f in nc.findings.items() if f.severity >= 2)
    findings = [(k[0], f.severity) for k, f in nc.findings.items()]
    if nc.state != NodeState.IN_SERVICE.value or nc.cordoned:
        why = f"control plane state {nc.state}{' (cordoned)' * nc.cordoned}"
    elif blocked_drain(view.policy, view.breaker.open, nc.state, findings):
        why = f"{BLOCKED_REASON} (fail finding {', '.join(fails)})"
    elif fails:
        why = f"fail finding {', '.join(fails)}"
    else:
        why = ""
    return NodeFacts(node, not why, why, nc.rack, nc.tenant)


class SchedulerEvents:
    """The lifecycle's calls into the backend, applied in order on one thread (the kernel's
    `gpufleet.control.state.ports.SchedulerHook`)."""

    def __init__(
        self, backend: SchedulerBackend, is_fail: Callable[[str], bool] = lambda node: False
    ) -> None:
        self.backend = backend
        self.is_fail = is_fail
        self.reports_idle = backend.capabilities().supports(Feature.REPORTS_IDLE)
        self.done: deque[tuple[str, str, str]] = deque(maxlen=1000)  # (event, node, outcome)
        self._calls: queue.Queue[Call | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _drains
        # node -> (confirmed, monotonic time of the newest failure or None while queued)
        self._drains: dict[str, tuple[bool, float | None]] = {}

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._work, name="gpufleet-sched-events", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued call ran; False on timeout."""
        done = threading.Event()
        self._put("flush", "", done.set)
        return done.wait(timeout_s)

    # ----- what the lifecycle calls ------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        fail = self.is_fail(node)  # now, as the transition left the node
        with self._lock:
            self._drains[node] = (False, None)

        def call() -> None:
            try:
                self.backend.drain(node, reason, fail=fail)
            except Exception:
                with self._lock:
                    self._drains[node] = (False, time.monotonic())
                raise
            with self._lock:
                self._drains[node] = (True, None)

        self._put("fail" if fail else "drain", node, call)

    def resume(self, node: str) -> None:
        with self._lock:
            self._drains.pop(node, None)
        self._put("resume", node, lambda: self.backend.resume(node))

    def evacuate(
        self,
        node: str,
        reason: str,
        *,
        signal: str,
        grace_s: float,
        then: Callable[[Evacuation], None],
    ) -> None:
        """A drain's deadline: the backend checkpoint-signals and requeues the node's jobs;
        ``then`` gets its answer (on the scheduler thread). A backend without the feature
        answers with a note and evacuates nothing (the drain then waits for its jobs)."""

        def call() -> None:
            caps = self.backend.capabilities()
            if caps.supports(Feature.EVACUATE):
                result = self.backend.evacuate(node, reason, signal=signal, grace_s=grace_s)
            else:
                result = Evacuation(note=caps.why(Feature.EVACUATE))
            then(result)

        self._put("evacuate", node, call)

    def lost(self, node: str) -> None:
        self._put("lost", node, lambda: self.backend.node_lost(node))

    def drain_confirmed(self, node: str) -> bool:
        """Has the backend drained ``node``? If it never was (this process did not drain it) or
        its drain failed ``RETRY_DRAIN_S`` ago, the drain is queued (again) and the answer is
        False until it succeeds."""
        with self._lock:
            state = self._drains.get(node)
        if state is not None:
            confirmed, failed_at = state
            if confirmed or failed_at is None or time.monotonic() - failed_at < RETRY_DRAIN_S:
                return confirmed
        self.drain(node, "gpufleet: drain (again: the scheduler had not confirmed it)")
        with self._lock:
            return self._drains[node][0]

    def is_idle(self, node: str) -> bool:
        """Does work still run on ``node``? Asked once its drain is confirmed; an error: no."""
        try:
            return self.backend.is_idle(node)
        except GpufleetError as exc:
            log.warning("scheduler %s: is_idle(%s): %s", self.backend.name, node, exc)
            return False

    @property
    def runs_agent_jobs(self) -> bool:
        """Do agents run the backend's jobs (asked of the backend at each report)?"""
        return self.backend.capabilities().supports(Feature.AGENT_JOBS)

    def exchange(self, batch: Batch, now_s: float) -> list[WireCommand]:
        """An agent batch's jobs report to the backend; the commands it has for the node."""
        return self.backend.exchange(batch, now_s)

    # ----- the thread ----------------------------------------------------------------------------
    def _put(self, event: str, node: str, fn: Callable[[], None]) -> None:
        if self._thread is None:
            self._run((event, node, fn))
        else:
            self._calls.put((event, node, fn))

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            self._run(call)

    def _run(self, call: Call) -> None:
        event, node, fn = call
        try:
            fn()
            outcome = "ok"
        except GpufleetError as exc:
            outcome = f"error: {exc}"
            log.warning("scheduler %s: %s %s: %s", self.backend.name, event, node, exc)
        except Exception as exc:  # a backend bug must not stop the thread
            outcome = f"error: {exc!r}"
            log.exception("scheduler %s: %s %s failed", self.backend.name, event, node)
        if node:
            self.done.append((event, node, outcome))
