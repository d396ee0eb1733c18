"""The notification outbox (issue 29): the table ``notification_outbox`` and every statement on
it. One row per (notification id, receiver), written in the transaction of the event row that
causes it (`insert`), so a notification exists exactly when its event committed and survives a
``kill -9``; then ``pending`` until a delivery lane sends it (``delivered``) or gives up
(``dead``).

**One replica at a time.** With several controllers on one PostgreSQL every replica runs the
lanes of the receivers it is configured with, and a lane takes a row only by claiming it: a
compare-and-set ``UPDATE ... SET claimed_by = me, claimed_until_s = now + claim WHERE id = ? AND
state = 'pending' AND (claimed_until_s IS NULL OR claimed_until_s < now)`` that changes one row
or none (PostgreSQL re-checks the condition against a concurrent update, SQLite has one writer
at a time). So a row is being sent by at most one replica while its claim holds (one attempt
at most, with margin), whichever replica leads, and a replica that dies mid-attempt leaves a
claim that expires: another replica (or this one restarted) sends the row again. The marks
after an attempt check the claim too, so a replica whose claim ran out writes nothing. SQLite
has one controller (its lock file): at start it drops every claim, since none can be live.
Claims are taken on the controllers' wall clocks, so their skew must stay well under the claim
(``3 x timeout + 10 s``): NTP does that.

**Not on the writer thread.** The marks (claim, delivered, retry, dead) are short transactions
of their own on the lane's thread, never commands of the store's writer
(`gpufleet.control.state.writer`): the writer is the ingest path's group commit, and a lane
that waited in its queue behind batches would hold up its receiver, and every batch queued
behind a mark would wait for it. One mark is one small UPDATE by primary key; on SQLite it
takes the write lock for one commit, which the writer's busy timeout (10 s) rides out, and on
PostgreSQL it locks one row the writer never touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, case, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.control.db.models import NotificationOutbox as Row

PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"
ERROR_LEN = 200


@dataclass(frozen=True)
class Claimed:
    """One row this controller now holds the claim on."""

    id: int
    notification_id: str
    payload: dict[str, Any]
    attempts: int
    created_s: float


def insert_rows(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Add pending rows (``notification_id``, ``receiver``, ``payload``, ``created_s``) in the
    transaction of ``conn`` (the event row's own)."""
    if rows:
        conn.execute(
            insert(Row),
            [
                {
                    **r,
                    "state": PENDING,
                    "attempts": 0,
                    "next_attempt_s": r["created_s"],
                }
                for r in rows
            ],
        )


class Outbox:
    """The statements of the delivery lanes and the status read, each in its own short
    transaction (``sessions``: the controller's session factory); ``holder``: this process's
    name in ``claimed_by``."""

    def __init__(self, sessions: sessionmaker[Session], holder: str) -> None:
        self.sessions = sessions
        self.holder = holder[:160]

    def release_claims(self) -> int:
        """Drop every claim (SQLite at start: the one controller is this one)."""
        with self.sessions.begin() as s:
            res = s.execute(
                update(Row)
                .where(Row.state == PENDING, Row.claimed_until_s.is_not(None))
                .values(claimed_by=None, claimed_until_s=None)
            )
            return int(getattr(res, "rowcount", 0) or 0)

    def claim_next(self, receiver: str, now_s: float, claim_s: float) -> Claimed | None:
        """The oldest due row of ``receiver`` nobody holds, now claimed by this controller;
        None when there is none (or another replica took it first: the caller asks again)."""
        free = or_(Row.claimed_until_s.is_(None), Row.claimed_until_s < now_s)
        with self.sessions.begin() as s:
            got = s.execute(
                select(Row.id, Row.notification_id, Row.payload, Row.attempts, Row.created_s)
                .where(
                    Row.receiver == receiver,
                    Row.state == PENDING,
                    Row.next_attempt_s <= now_s,
                    free,
                )
                .order_by(Row.id)
                .limit(1)
            ).first()
            if got is None:
                return None
            res = s.execute(
                update(Row)
                .where(Row.id == got.id, Row.state == PENDING, free)
                .values(claimed_by=self.holder, claimed_until_s=now_s + claim_s)
            )
            if getattr(res, "rowcount", 0) != 1:
                return None
        payload = got.payload if isinstance(got.payload, dict) else {}
        return Claimed(got.id, got.notification_id, payload, got.attempts, got.created_s)

    def next_due_s(self, receiver: str) -> float | None:
        """When the next pending row of ``receiver`` is due (its retry time, or the end of
        another's claim); None when none is pending."""
        with self.sessions() as s:
            due = s.execute(
                select(
                    func.min(
                        case(
                            (Row.claimed_until_s > Row.next_attempt_s, Row.claimed_until_s),
                            else_=Row.next_attempt_s,
                        )
                    )
                ).where(Row.receiver == receiver, Row.state == PENDING)
            ).scalar()
        return None if due is None else float(due)

    def _mark(self, row_id: int, **values: Any) -> bool:
        """Change a row this controller still holds the claim on; False when the claim was
        lost (another replica has it now, or it was marked already)."""
        with self.sessions.begin() as s:
            res = s.execute(
                update(Row)
                .where(Row.id == row_id, Row.state == PENDING, Row.claimed_by == self.holder)
                .values(claimed_by=None, claimed_until_s=None, **values)
            )
            return getattr(res, "rowcount", 0) == 1

    def delivered(self, row_id: int, attempts: int, now_s: float) -> bool:
        return self._mark(
            row_id, state=DELIVERED, attempts=attempts, last_attempt_s=now_s, done_s=now_s
        )

    def retry(self, row_id: int, attempts: int, now_s: float, due_s: float, error: str) -> bool:
        return self._mark(
            row_id,
            attempts=attempts,
            next_attempt_s=due_s,
            last_attempt_s=now_s,
            last_error=error[:ERROR_LEN],
        )

    def dead(self, row_id: int, attempts: int, now_s: float, error: str) -> bool:
        return self._mark(
            row_id,
            state=DEAD,
            attempts=attempts,
            last_attempt_s=now_s,
            last_error=error[:ERROR_LEN],
            done_s=now_s,
        )

    def pending(self, receivers: list[str]) -> int:
        """Pending rows of ``receivers`` (what a flush waits for)."""
        with self.sessions() as s:
            n = s.execute(
                select(func.count()).where(Row.state == PENDING, Row.receiver.in_(receivers))
            ).scalar()
        return int(n or 0)


def status(session: Session, now_s: float) -> list[dict[str, Any]]:
    """Per receiver that has rows: pending (``in_flight``: claimed now), delivered, failed
    attempts, dead-lettered, the oldest pending row's age and the last error with its time."""
    out: dict[str, dict[str, Any]] = {}

    def entry(receiver: str) -> dict[str, Any]:
        return out.setdefault(
            receiver,
            {
                "receiver": receiver,
                "pending": 0,
                "in_flight": 0,
                "delivered": 0,
                "failed_attempts": 0,
                "dead": 0,
                "oldest_pending_age_s": None,
                "last_error": None,
                "last_error_s": None,
            },
        )

    rows = session.execute(
        select(
            Row.receiver,
            Row.state,
            func.count(),
            func.coalesce(func.sum(Row.attempts), 0),
            func.min(Row.created_s),
            func.sum(case((Row.claimed_until_s > now_s, 1), else_=0)),
        ).group_by(Row.receiver, Row.state)
    ).all()
    for receiver, state, count, attempts, oldest, claimed in rows:
        e = entry(receiver)
        # every attempt failed but a delivered row's last one
        e["failed_attempts"] += int(attempts) - (int(count) if state == DELIVERED else 0)
        if state == PENDING:
            e["pending"] = int(count)
            e["in_flight"] = int(claimed or 0)
            e["oldest_pending_age_s"] = max(0.0, now_s - float(oldest))
        elif state == DELIVERED:
            e["delivered"] = int(count)
        elif state == DEAD:
            e["dead"] = int(count)
    for receiver, e in out.items():
        last = session.execute(
            select(Row.last_error, Row.last_attempt_s)
            .where(Row.receiver == receiver, Row.last_error.is_not(None))
            .order_by(Row.last_attempt_s.desc())
            .limit(1)
        ).first()
        if last is not None:
            e["last_error"], e["last_error_s"] = last.last_error, last.last_attempt_s
    return [out[k] for k in sorted(out)]


def retain(session: Session, before_s: float) -> int:
    """Delete delivered and dead rows of notifications older than ``before_s`` (the event
    retention); pending rows stay until they are delivered or dead-lettered."""
    res = session.execute(
        delete(Row).where(Row.state.in_((DELIVERED, DEAD)), Row.created_s < before_s)
    )
    return int(getattr(res, "rowcount", 0) or 0)
