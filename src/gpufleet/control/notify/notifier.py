"""The controller's own notifications (issue 18): node state changes, the circuit breaker
opening (and closing), failed validations and failed maintenance steps, delivered to webhooks
and email (`gpufleet.control.notify.sinks`) with retries and exponential backoff.

The controller (``gpufleet controller --notify``, ``gpufleet up --notify``) delivers through
the durable outbox (`gpufleet.control.notify.durable.OutboxNotifier`, issue 29), which takes
its receivers and retry settings from a `Notifier` built here and reads its rows with its own
lanes; the in-memory path below (`SessionNotifier` over `Notifier`) remains for callers with no
database to keep notifications in.

Where they come from: `SessionNotifier` is the kernel's notifier port
(`gpufleet.control.state.ports.Notifier`), handed to the store with ``store.tell``. The store
gives it every ``EventRow`` and ``ValidationResultRow`` a transaction writes, inside that
transaction; those of a notifying kind (``transition``, ``circuit_breaker_open``/``_closed``,
``maintenance_step_failed``) and every failed validation are handed over after the transaction
commits, never before and never for a rollback. So any
code that records such an event notifies, without a call of its own; code with no event row
to write calls `record_event` (e.g. a maintenance campaign's step failed).

Delivery never holds up the controller: the commit hook only puts the notification on each
receiver's own bounded lane (``put_nowait``; when a lane is full, that receiver's copy is
dropped, counted per receiver and logged once); each lane has its own worker thread that makes
the HTTP or SMTP calls and keeps its retries in a heap by due time, so a receiver that hangs
(up to its timeout a try) or refuses delays nothing but its own deliveries.

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


class _Lane:
    """One receiver's delivery lane: its own bounded queue, retry heap, worker thread and
    counts, so a receiver that hangs or refuses delays and drops only its own notifications."""

    def __init__(self, owner: Notifier, sink: Sink) -> None:
        self.owner = owner
        self.sink = sink
        self.stats: Counter[str] = Counter()
        self.queue: queue.Queue[_Delivery | None] = queue.Queue(maxsize=owner.queue_size)
        self.retries: list[_Delivery] = []
        self.thread: threading.Thread | None = None
        self.warned_full = False

    def offer(self, d: _Delivery) -> bool:
        try:
            self.queue.put_nowait(d)
        except queue.Full:
            self.count("dropped")
            if not self.warned_full:
                self.warned_full = True
                log.warning(
                    "notification queue of %s full (%d): dropping %s %s (and counting further "
                    "drops in gpufleet's notify stats); this receiver is too slow",
                    self.sink.name,
                    self.owner.queue_size,
                    d.n.kind,
                    d.n.id,
                )
            return False
        self.count("queued")
        return True

    def count(self, what: str) -> None:
        self.stats[what] += 1

    def start(self) -> None:
        name = f"gpufleet-notify-{self.sink.name}"
        self.thread = threading.Thread(target=self.work, name=name, daemon=True)
        self.thread.start()

    def work(self) -> None:
        clock, stopping = self.owner.clock, self.owner._stopping
        while not stopping.is_set():
            now = clock()
            if self.retries and self.retries[0].due <= now:
                self.attempt(heapq.heappop(self.retries))
                continue
            wait = min(1.0, self.retries[0].due - now) if self.retries else 1.0
            try:
                d = self.queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                continue
            if d is None:
                break
            self.attempt(d)

    def attempt(self, d: _Delivery) -> None:
        owner = self.owner
        try:
            d.sink.deliver(d.n, d.attempt)
        except DeliveryError as exc:
            if exc.retry and d.attempt < owner.retry.attempts:
                d.due = owner.clock() + owner.backoff_s(d.attempt)
                d.attempt += 1
                self.count("retried")
                log.info("notification %s to %s: %s; retrying", d.n.id, d.sink.name, exc)
                heapq.heappush(self.retries, d)
                return
            self.count("failed")
            log.warning(
                "notification %s (%s) to %s failed after %d attempt(s): %s",
                d.n.id,
                d.n.kind,
                d.sink.name,
                d.attempt,
                exc,
            )
        except Exception:  # a bug in a sink must not end the lane
            self.count("failed")
            log.exception("notification %s to %s failed", d.n.id, d.sink.name)
        else:
            self.count("delivered")
        owner._done()


class Notifier:
    """Delivers to ``sinks`` with retries: one lane (bounded queue of ``queue_size``, worker
    thread, retry heap) per receiver, so one that hangs never delays another."""

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
        self._seq = itertools.count()
        self._stopping = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0  # deliveries queued, waiting for a retry or in flight
        self._on_close = on_close
        self._lanes = [_Lane(self, sink) for sink in self.sinks]
        self._started = False

    @property
    def stats(self) -> Counter[str]:
        """Totals over every lane, summed from the lanes' own counts when asked."""
        total: Counter[str] = Counter()
        for lane in self._lanes:
            total.update(lane.stats)
        return total

    # -- producers (any thread; never block) -----------------------------------------------
    def publish(self, n: Notification) -> bool:
        """Queue ``n`` in the lane of every sink that wants it; False when (some of) it was
        dropped because that receiver's lane is full."""
        ok = True
        for lane in self._lanes:
            if not lane.sink.wants(n):
                continue
            with self._idle:
                self._busy += 1
            if not lane.offer(_Delivery(0.0, next(self._seq), lane.sink, n)):
                self._done()
                ok = False
        return ok

    def receivers(self) -> dict[str, dict[str, int]]:
        """Per receiver: queued, retried, delivered, failed and dropped counts, and how many
        wait in its lane now (``waiting``: queued or due for a retry)."""
        out: dict[str, dict[str, int]] = {}
        for lane in self._lanes:
            counts = {k: lane.stats[k] for k in ("queued", "retried", "delivered", "failed")}
            counts["dropped"] = lane.stats["dropped"]
            counts["waiting"] = lane.queue.qsize() + len(lane.retries)
            name = lane.sink.name
            out[name if name not in out else f"{name} #{len(out) + 1}"] = counts
        return out

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Notifier:
        for lane in self._lanes:
            lane.start()
        self._started = True
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (first attempts) for up to ``timeout_s``, then end."""
        if self._started:
            self.flush(timeout_s)
            self._stopping.set()
            for lane in self._lanes:
                with contextlib.suppress(queue.Full):  # the lane also sees _stopping
                    lane.queue.put_nowait(None)
            end = time.monotonic() + timeout_s
            for lane in self._lanes:
                if lane.thread is not None:
                    lane.thread.join(timeout=max(0.0, end - time.monotonic()))
                    lane.thread = None
            self._started = False
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

    def backoff_s(self, attempt: int) -> float:
        """Wait before attempt ``attempt + 1``: backoff_s x 2^(attempt-1), capped, +-10 %."""
        base = min(self.retry.max_backoff_s, self.retry.backoff_s * 2 ** (attempt - 1))
        return float(base * random.uniform(0.9, 1.1))


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
