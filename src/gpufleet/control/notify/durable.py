"""Durable delivery (issue 29): `OutboxNotifier`, the kernel's notifier port over the outbox
table (`gpufleet.control.notify.outbox`), and one delivery lane per receiver reading it.

Inside the transaction of every notifying event row, `OutboxNotifier.enqueue` writes one
outbox row per receiver that wants the notification; after the commit it wakes those
receivers' lanes; a rollback takes the rows with it. Each lane (its own thread, so a receiver
that hangs delays only its own rows) claims the oldest due row of its receiver, makes one
attempt, and marks the row delivered, due again after a backoff, or dead. A controller killed
at any point loses nothing: at its next start the lanes find the pending rows. Delivery is at
least once: a row whose attempt reached the receiver but whose mark did not commit (the
process died in between) is sent again with the same id (``X-Gpufleet-Id``, the body's
``id``, the e-mail ``Message-ID``), one row per receiver at most, the one in flight.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gpufleet.control.db.engine import session_factory
from gpufleet.control.db.models import EventRow, ValidationResultRow
from gpufleet.control.notify.notification import Notification
from gpufleet.control.notify.notifier import Notifier, from_event, from_validation
from gpufleet.control.notify.outbox import Claimed, Outbox, insert_rows
from gpufleet.control.notify.sinks import DeliveryError, Sink

log = logging.getLogger("gpufleet.control.notify")

_WRITTEN = "gpufleet_outbox_written"
POLL_S = 1.0  # rows other replicas wrote, and retries, are found at least this often


def receiver_names(sinks: list[Sink]) -> list[str]:
    """The name of each sink in the outbox: its own (``webhook https://host``: never a path),
    made unique by ``#N`` in the order of the configuration."""
    out: list[str] = []
    for sink in sinks:
        out.append(sink.name if sink.name not in out else f"{sink.name} #{len(out) + 1}")
    return out


class _OutboxLane:
    """One receiver's lane: a thread that claims, sends and marks that receiver's rows."""

    def __init__(self, owner: OutboxNotifier, sink: Sink, receiver: str) -> None:
        self.owner = owner
        self.sink = sink
        self.receiver = receiver
        self.wake = threading.Event()
        self.stats: Counter[str] = Counter()
        self.thread: threading.Thread | None = None
        self.db_trouble = False
        # one attempt at most while a claim holds, with margin (an attempt may take up to
        # the sink's timeout for each of connect, write and read)
        self.claim_s = 3 * float(getattr(sink, "timeout_s", 10.0)) + 10.0

    def start(self) -> None:
        name = f"gpufleet-outbox-{self.receiver}"
        self.thread = threading.Thread(target=self.work, name=name, daemon=True)
        self.thread.start()

    def work(self) -> None:
        owner = self.owner
        while not owner.stopping.is_set():
            self.wake.clear()
            try:
                claimed = owner.outbox.claim_next(self.receiver, owner.clock(), self.claim_s)
                if claimed is not None:
                    self.attempt(claimed)
                    continue
                due = owner.outbox.next_due_s(self.receiver)
                self._db_ok()
            except SQLAlchemyError as exc:  # the database is away: try again later
                self._db_away(exc)
                due = None
            now = owner.clock()
            wait = POLL_S if due is None else min(POLL_S, max(0.0, due - now))
            if wait > 0:
                self.wake.wait(wait)

    def _db_ok(self) -> None:
        if self.db_trouble:
            self.db_trouble = False
            log.info("notification outbox of %s readable again", self.receiver)

    def _db_away(self, exc: SQLAlchemyError) -> None:
        if not self.db_trouble:
            self.db_trouble = True
            log.warning(
                "notification outbox of %s: database unavailable (%s); retrying",
                self.receiver,
                type(exc).__name__,
            )

    def attempt(self, c: Claimed) -> None:
        owner, outbox = self.owner, self.owner.outbox
        n = Notification.from_json(c.payload)
        attempt = c.attempts + 1
        if owner.clock() - c.created_s > owner.retry.max_age_s:
            self._dead(c, c.attempts, f"expired after {owner.retry.max_age_s:g} s undelivered")
            return
        try:
            self.sink.deliver(n, attempt)
        except DeliveryError as exc:
            error = str(exc) or type(exc).__name__
            now = owner.clock()
            if exc.retry and attempt < owner.retry.attempts:
                self.stats["retried"] += 1
                log.info(
                    "notification %s to %s: %s; retrying", c.notification_id, self.receiver, error
                )
                outbox.retry(c.id, attempt, now, now + owner.backoff_s(attempt), error)
                return
            self._dead(c, attempt, error)
        except Exception:  # a bug in a sink must not end the lane
            log.exception("notification %s to %s failed", c.notification_id, self.receiver)
            self._dead(c, attempt, "internal error (see the controller's log)")
        else:
            self.stats["delivered"] += 1
            outbox.delivered(c.id, attempt, owner.clock())

    def _dead(self, c: Claimed, attempts: int, error: str) -> None:
        self.stats["dead"] += 1
        log.warning(
            "notification %s to %s dead-lettered after %d attempt(s): %s",
            c.notification_id,
            self.receiver,
            attempts,
            error,
        )
        self.owner.outbox.dead(c.id, attempts, self.owner.clock(), error)


class OutboxNotifier:
    """The kernel's notifier port (`gpufleet.control.state.ports.Notifier`) over the outbox:
    ``notifier`` gives the receivers (its sinks), the retry settings and the close hook;
    ``engine``: the controller's database; ``db``: its identity in every notification id
    (`gpufleet.control.notify.notifier.database_id`). ``start()`` starts the lanes."""

    def __init__(
        self,
        notifier: Notifier,
        engine: Engine,
        db: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.notifier = notifier
        self.db = db
        self.retry = notifier.retry
        self.clock = clock
        self.sqlite = engine.dialect.name == "sqlite"
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.outbox = Outbox(session_factory(engine), holder)
        self.stopping = threading.Event()
        names = receiver_names(notifier.sinks)
        self.lanes = [_OutboxLane(self, s, r) for s, r in zip(notifier.sinks, names, strict=True)]

    # -- the port (the writer thread, inside and after the transaction) -------------------
    def enqueue(self, session: Session, row: EventRow | ValidationResultRow) -> None:
        n = from_event(row, self.db) if isinstance(row, EventRow) else from_validation(row, self.db)
        if n is None:
            return
        lanes = [lane for lane in self.lanes if lane.sink.wants(n)]
        if not lanes:
            return
        payload = n.to_json()
        insert_rows(
            session.connection(),
            [
                {
                    "notification_id": n.id,
                    "receiver": lane.receiver,
                    "payload": payload,
                    "created_s": self.clock(),
                }
                for lane in lanes
            ],
        )
        session.info.setdefault(_WRITTEN, set()).update(id(lane) for lane in lanes)

    def committed(self, session: Session) -> None:
        written = session.info.pop(_WRITTEN, None)
        if written:
            for lane in self.lanes:
                if id(lane) in written:
                    lane.wake.set()

    def rolled_back(self, session: Session) -> None:
        session.info.pop(_WRITTEN, None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> OutboxNotifier:
        """Start a lane per receiver; on SQLite (one controller) drop the claims a killed
        process left, so its rows in flight go out at once."""
        if self.sqlite:
            try:
                if released := self.outbox.release_claims():
                    log.info("notification outbox: %d row(s) in flight at the last stop", released)
            except SQLAlchemyError as exc:
                log.warning("notification outbox: claims not released (%s)", type(exc).__name__)
        for lane in self.lanes:
            lane.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Send what is due now for up to ``timeout_s`` (what is left stays pending in the
        outbox for the next start), then end the lanes."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self._due_now():
            time.sleep(0.05)
        self.stopping.set()
        for lane in self.lanes:
            lane.wake.set()
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=max(0.1, end - time.monotonic()))
                lane.thread = None
        self.notifier.stop(0.0)  # its own lanes never ran: this closes its HTTP client

    def _due_now(self) -> bool:
        if not any(lane.thread is not None for lane in self.lanes):
            return False
        now = self.clock()
        try:
            for lane in self.lanes:
                due = self.outbox.next_due_s(lane.receiver)
                if due is not None and due <= now:
                    return True
        except SQLAlchemyError:
            return False
        return False

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until no row of these receivers is pending (retries included); False on
        timeout."""
        end = time.monotonic() + timeout_s
        receivers = [lane.receiver for lane in self.lanes]
        while self.outbox.pending(receivers) > 0:
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def backoff_s(self, attempt: int) -> float:
        return self.notifier.backoff_s(attempt)

    @property
    def stats(self) -> Counter[str]:
        """This process's attempts' outcomes (delivered, retried, dead), over every lane."""
        total: Counter[str] = Counter()
        for lane in self.lanes:
            total.update(lane.stats)
        return total
