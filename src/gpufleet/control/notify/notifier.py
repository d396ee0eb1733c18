"""The controller's own notifications (issue 18): node state changes, the circuit breaker
opening (and closing), failed validations and failed maintenance steps, delivered to webhooks
and email (`gpufleet.control.notify.sinks`) with retries and exponential backoff.

Where they come from: `SessionNotifier` is the kernel's notifier port
(`gpufleet.control.state.ports.Notifier`), handed to the store with ``store.tell``. The store
gives it every ``EventRow`` and ``ValidationResultRow`` a transaction writes, inside that
transaction; those of a notifying kind (``transition``, ``circuit_breaker_open``/``_closed``,
``maintenance_step_failed``) and every failed validation are handed over after the transaction
commits, never before and never for a rollback. So any
code that records such an event notifies, without a call of its own; code with no event row
to write calls `record_event` (e.g. a maintenance campaign's step failed), or
`Notifier.publish` directly.

Delivery never holds up the controller: the commit hook only puts the notification on a
bounded queue (``put_nowait``; when full, the notification is dropped, counted and logged);
one worker thread of the notifier's own makes the HTTP and SMTP calls and keeps the retries
in a heap by due time, so a slow or dead receiver delays nothing but its own retries.

Each notification has an ``id`` made from the database's identity and the row's id: the same
on every attempt (headers ``X-Gpufleet-Id``, e-mail ``Message-ID``), so a receiver that got an
attempt whose answer was lost can drop the repeat.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy.orm import Session

from gpufleet.control.db.models import EventRow, ValidationResultRow
from gpufleet.control.notify.config import NotifyConfig, RetryConfig, read_secret
from gpufleet.control.notify.notification import Notification
from gpufleet.control.notify.sinks import DeliveryError, EmailSink, Sink, WebhookSink

log = logging.getLogger("gpufleet.control.notify")

# event row kind -> notification kind
NOTIFYING_EVENTS = {
    "transition": "node_state",
    "circuit_breaker_open": "circuit_breaker_open",
    "circuit_breaker_closed": "circuit_breaker_closed",
    "maintenance_step_failed": "maintenance_step_failed",
}
_PENDING = "gpufleet_notify_pending"


@dataclass(order=True)
class _Delivery:
    due: float
    seq: int
    sink: Sink = field(compare=False)
    n: Notification = field(compare=False)
    attempt: int = field(compare=False, default=1)


class Notifier:
    """A bounded queue and one worker thread that delivers to ``sinks`` with retries."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        retry: RetryConfig | None = None,
        queue_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self.retry = retry or RetryConfig()
        self.queue_size = queue_size
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self._queue: queue.Queue[_Delivery | None] = queue.Queue(maxsize=queue_size)
        self._retries: list[_Delivery] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0  # deliveries queued, waiting for a retry or in flight
        self._on_close = on_close
        self._warned_full = False

    # -- producers (any thread; never block) -----------------------------------------------
    def publish(self, n: Notification) -> bool:
        """Queue ``n`` for every sink that wants it; False when (some of) it was dropped
        because the queue is full."""
        ok = True
        for sink in self.sinks:
            if not sink.wants(n):
                continue
            d = _Delivery(0.0, next(self._seq), sink, n)
            with self._idle:
                self._busy += 1
            try:
                self._queue.put_nowait(d)
                self.stats["queued"] += 1
            except queue.Full:
                self._done()
                self.stats["dropped"] += 1
                ok = False
                if not self._warned_full:
                    self._warned_full = True
                    log.warning(
                        "notification queue full (%d): dropping %s %s; receivers are too slow",
                        self.queue_size,
                        n.kind,
                        n.id,
                    )
        return ok

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Notifier:
        self._thread = threading.Thread(target=self._work, name="gpufleet-notify", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (first attempts) for up to ``timeout_s``, then end."""
        if self._thread is not None:
            self.flush(timeout_s)
            self._stopping.set()
            with contextlib.suppress(queue.Full):  # the worker also sees _stopping
                self._queue.put_nowait(None)
            self._thread.join(timeout=timeout_s)
            self._thread = None
        if self._on_close is not None:
            self._on_close()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until nothing is queued, waiting for a retry or in flight; False on timeout."""
        end = time.monotonic() + timeout_s
        with self._idle:
            while self._busy > 0:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _done(self) -> None:
        with self._idle:
            self._busy -= 1
            if self._busy <= 0:
                self._idle.notify_all()

    # -- the worker -------------------------------------------------------------------------
    def backoff_s(self, attempt: int) -> float:
        """Wait before attempt ``attempt + 1``: backoff_s x 2^(attempt-1), capped, +-10 %."""
        base = min(self.retry.max_backoff_s, self.retry.backoff_s * 2 ** (attempt - 1))
        return float(base * random.uniform(0.9, 1.1))

    def _work(self) -> None:
        while not self._stopping.is_set():
            now = self.clock()
            if self._retries and self._retries[0].due <= now:
                self._attempt(heapq.heappop(self._retries))
                continue
            wait = min(1.0, self._retries[0].due - now) if self._retries else 1.0
            try:
                d = self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                continue
            if d is None:
                break
            self._attempt(d)

    def _attempt(self, d: _Delivery) -> None:
        try:
            d.sink.deliver(d.n, d.attempt)
        except DeliveryError as exc:
            if exc.retry and d.attempt < self.retry.attempts:
                d.due = self.clock() + self.backoff_s(d.attempt)
                d.attempt += 1
                self.stats["retried"] += 1
                log.info("notification %s to %s: %s; retrying", d.n.id, d.sink.name, exc)
                heapq.heappush(self._retries, d)
                return
            self.stats["failed"] += 1
            log.warning(
                "notification %s (%s) to %s failed after %d attempt(s): %s",
                d.n.id,
                d.n.kind,
                d.sink.name,
                d.attempt,
                exc,
            )
        except Exception:  # a bug in a sink must not end the worker
            self.stats["failed"] += 1
            log.exception("notification %s to %s failed", d.n.id, d.sink.name)
        else:
            self.stats["delivered"] += 1
        self._done()


# -- where notifications come from ----------------------------------------------------------
def database_id(url: str) -> str:
    """A short, stable identity of a database (its URL without the password) for ids."""
    safe = url.split("@")[-1] if "@" in url else url
    return hashlib.sha256(safe.encode()).hexdigest()[:8]


def from_event(row: EventRow, db: str) -> Notification | None:
    kind = NOTIFYING_EVENTS.get(row.kind)
    if kind is None:
        return None
    data = dict(row.data or {})
    if kind == "node_state":
        summary = f"{data.get('from')} -> {data.get('to')}: {row.message.split(': ', 1)[-1]}"
    else:
        summary = row.message
    return Notification(
        id=f"gf-{db}-ev{row.id}",
        kind=kind,
        at_s=row.at_s,
        summary=summary,
        severity=row.severity or 0,
        node=row.node,
        data=data,
    )


def from_validation(row: ValidationResultRow, db: str) -> Notification | None:
    if row.verdict != "fail":
        return None
    payload = row.payload if isinstance(row.payload, dict) else {}
    summary = payload.get("summary")
    return Notification(
        id=f"gf-{db}-val{row.id}",
        kind="validation_failed",
        at_s=row.received_s,
        summary=f"validation failed{': ' + summary[:200] if isinstance(summary, str) else ''}",
        severity=2,
        node=row.node,
        data={"verdict": row.verdict, "actor": row.actor},
    )


class SessionNotifier:
    """The kernel's notifier port over a `Notifier`: the notifying rows of a transaction
    (``db``: the database's identity, `database_id`, in each notification's id) wait in the
    session until it commits, then go to ``notifier``; a rollback drops them."""

    def __init__(self, notifier: Notifier, db: str) -> None:
        self.notifier = notifier
        self.db = db

    def enqueue(self, session: Session, row: EventRow | ValidationResultRow) -> None:
        n = from_event(row, self.db) if isinstance(row, EventRow) else from_validation(row, self.db)
        if n is not None:
            session.info.setdefault(_PENDING, []).append(n)

    def committed(self, session: Session) -> None:
        for n in session.info.pop(_PENDING, []):
            self.notifier.publish(n)

    def rolled_back(self, session: Session) -> None:
        session.info.pop(_PENDING, None)


def record_event(
    session: Session,
    kind: str,
    *,
    message: str,
    now_s: float,
    node: str | None = None,
    severity: int = 2,
    data: dict[str, Any] | None = None,
) -> EventRow:
    """Record an event that notifies once ``session`` commits (when a notifier is attached):
    e.g. ``record_event(s, "maintenance_step_failed", node=..., message=..., now_s=...,
    data={"campaign": ..., "step": ...})``. The row is in the event log as well."""
    if kind not in NOTIFYING_EVENTS:
        raise ValueError(f"{kind!r} is not a notifying event kind")
    row = EventRow(
        at_s=now_s, node=node, kind=kind, severity=severity, message=message, data=data or {}
    )
    session.add(row)
    return row


def build_notifier(cfg: NotifyConfig, source: str = "--notify") -> Notifier:
    """The sinks of ``cfg`` (secrets read now, so a bad file fails at start) in a notifier."""
    client = httpx.Client(follow_redirects=False)
    sinks: list[Sink] = []
    for i, w in enumerate(cfg.webhooks):
        secret = read_secret(w.secret_file, f"{source}: webhooks.{i}") if w.secret_file else None
        sinks.append(WebhookSink(w, secret, client))
    for i, e in enumerate(cfg.email):
        password = None
        if e.password_file is not None:
            where = f"{source}: email.{i}.password_file"
            password = read_secret(e.password_file, where).decode()
        sinks.append(EmailSink(e, password))
    return Notifier(sinks, retry=cfg.retry, queue_size=cfg.queue_size, on_close=client.close)
