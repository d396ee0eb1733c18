"""Leader election among controller replicas sharing one database, with a fencing token
(issue 18; docs/control-plane.md, "High availability").

Every replica serves the API and ingests; exactly one, the leader, runs the periodic work:
lost detection and drain completion, remediation retries, maintenance campaigns and the
embedded scheduler's placement. The lease is one row of ``leader_lease``: ``holder``,
``expires_s`` (the database's clock, so replicas on different machines need no common clock)
and ``epoch``, the fencing token, growing at every change of holder: one past both the row's
and the highest this replica has seen, so it grows even when the row goes back in time (a
lagging standby promoted, a database restored). A lease row rather than
a PostgreSQL advisory lock: an advisory lock belongs to a connection, so a leader whose
connection the pool recycles, or a proxy (PgBouncer) in transaction mode, silently loses or
shares it, and it carries no number that a write can be checked against.

Each replica's `Leadership` thread tries every ``renew_s`` to take the lease (when it expired),
or to renew its own (only while the epoch is still the one it took). A replica treats itself
as leader until ``lease_s`` after its last successful renewal began (monotonic clock), so a
leader cut off from the database stops its periodic work before another replica can take over.

The fence: every transaction of leader work (the code inside `Leadership.fenced`) begins by
reading the lease row ``FOR SHARE`` and is refused (`StaleLeader`) unless the epoch and the
holder are still this replica's. The share lock holds until that transaction ends, so a
takeover (an ``UPDATE`` of the row) waits for it: no write of an old leader can commit after a
new leader's epoch.
A leader stopped (SIGSTOP) past its lease and resumed has every write refused, its renewal
too (``UPDATE ... WHERE epoch = mine`` finds no row); the refusals are counted (``refusals``)
and logged ("fencing token refused"). A stopped leader inside such a transaction holds the
share lock: ``idle_in_transaction_session_timeout`` (the lease) makes PostgreSQL end that
session, so the takeover waits at most that long; the same holds inside the election's own
transaction, and every other session of a replica ends after twice the lease (at least 10 s)
idle in a transaction, so a stopped replica's row locks hold nobody up for longer.

On SQLite only one controller runs per database (the data directory's lock file,
`gpufleet.control.db.backup.controller_lock`): the same code runs with ``exclusive``, taking the
lease at once whatever the row says, and never lapsing by its own clock (nobody can take over).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Engine, event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from gpufleet.control.db.models import LeaderLease
from gpufleet.control.state.ports import RefusedUnchanged

log = logging.getLogger("gpufleet.control.leader")
P = ParamSpec("P")
T = TypeVar("T")
LEASE_ID = 1
DEFAULT_LEASE_S = 6.0  # with renew every 2 s: a new leader within 8 s of a kill -9
DEFAULT_RENEW_S = 2.0


class StaleLeader(RuntimeError):
    """A write of leader work was refused: the lease's epoch is no longer this replica's."""


class NotLeading(StaleLeader, RefusedUnchanged):
    """Leader work refused before it began, this replica knowing it does not lead: nothing
    was read or written (so nothing needs undoing)."""


def holder_id() -> str:
    """This process's name in the lease: host, pid and a random part (a restarted process
    with a reused pid is still someone else)."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leadership:
    """This replica's side of the election; ``fenced()`` guards leader work."""

    def __init__(
        self,
        engine: Engine,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        renew_s: float = DEFAULT_RENEW_S,
        exclusive: bool = False,
        holder: str | None = None,
    ) -> None:
        if not 0 < renew_s < lease_s:
            raise ValueError(f"lease {lease_s} s, renew {renew_s} s: need 0 < renew < lease")
        self.engine = engine
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.exclusive = exclusive
        self.holder = holder or holder_id()
        self.postgres = engine.dialect.name == "postgresql"
        self.epoch: int | None = None  # the epoch this replica took, while it thinks it leads
        self.refusals = 0  # writes refused by the fencing token (renewals included)
        # times it led and its lease ran out before a renewal got through (the database away,
        # the process stopped): it stepped down by its own clock, nothing refused or written
        self.lapses = 0
        self.elections = 0  # times this replica took the lease
        # the highest epoch this replica has seen in the row: a takeover goes past it, so the
        # fencing token grows even when the row went back in time (a promoted standby that had
        # not yet received the last change of holder)
        self.highest_epoch = 0
        self._valid_until = 0.0  # monotonic: leader until then unless renewed
        self._local = threading.local()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: Callable[[bool], None] = lambda _leading: None
        event.listen(engine, "begin", self._on_begin)
        if self.postgres:
            event.listen(engine, "connect", self._on_connect)

    def _on_connect(self, dbapi_conn: Any, _record: Any) -> None:
        """Every session of this replica: a transaction left idle (the process stopped, or
        hung) ends after twice the lease, at least 10 s, so the row locks it held do not stop
        the other replicas' writes for longer."""
        ms = int(max(2 * self.lease_s, 10.0) * 1000)
        cur = dbapi_conn.cursor()
        cur.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        cur.close()
        dbapi_conn.commit()

    # -- state ----------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Does this replica lead now? Replicated: until ``lease_s`` after its last successful
        renewal began. ``exclusive`` (SQLite, the lock file's one controller): from taking the
        lease until a write is refused, however long a renewal is held up, since no other
        replica can take over (a CPU-starved lone controller once let its lease run out and
        refused its own leader work)."""
        if self.epoch is None:
            return False
        return self.exclusive or time.monotonic() < self._valid_until

    def describe(self) -> dict[str, Any]:
        """What ``GET /api/v1/health`` and the tests show of the election."""
        return {
            "holder": self.holder,
            "leader": self.is_leader,
            "epoch": self.epoch if self.is_leader else None,
            "refusals": self.refusals,
            "lapses": self.lapses,
            "elections": self.elections,
            "lease_s": self.lease_s,
            "renew_s": self.renew_s,
        }

    # -- the election ---------------------------------------------------------------------------
    def start(self, on_change: Callable[[bool], None] | None = None) -> None:
        """One attempt now (a lone controller leads from its first tick), then every
        ``renew_s`` on a thread of its own."""
        if on_change is not None:
            self._on_change = on_change
        self.step()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning and hand the lease back (another replica leads at its next try)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        mine, self.epoch = self.epoch, None
        if mine is None:
            return
        with contextlib.suppress(Exception), self.engine.begin() as conn:
            conn.execute(
                update(LeaderLease)
                .where(LeaderLease.id == LEASE_ID, LeaderLease.epoch == mine)
                .values(expires_s=0.0)
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            self.step()

    def step(self) -> bool:
        """Take or renew the lease once; returns whether this replica leads now."""
        before = self.is_leader
        started = time.monotonic()
        try:
            got = self._attempt()
        except (OperationalError, IntegrityError) as exc:  # database away, lock wait, race
            log.warning("leader election: %s", str(exc).splitlines()[0])
            got = None
        except Exception:
            log.exception("leader election failed")
            got = None
        with self._lock:
            if got is not None:
                if got != self.epoch:
                    self.elections += 1
                    log.warning("%s leads now (epoch %d)", self.holder, got)
                self.epoch = got
                self._valid_until = started + self.lease_s
            elif not self.is_leader:
                if self.epoch is not None:
                    self.lapses += 1
                    log.warning(
                        "%s leads no longer: the lease of epoch %d ran out before a renewal "
                        "got through",
                        self.holder,
                        self.epoch,
                    )
                self.epoch = None
        after = self.is_leader
        if after != before:
            try:
                self._on_change(after)
            except Exception:
                log.exception("leader change handler failed")
        return after

    def _attempt(self) -> int | None:
        """The epoch this replica leads with after one transaction, or None."""
        with self.engine.begin() as conn:
            if self.postgres:
                # neither wait long for the row, nor hold it if stopped inside this transaction
                ms = int(self.renew_s * 1000)
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
                idle = int(self.lease_s * 1000)
                conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {idle}")
            now = self._db_now(conn)
            row = conn.execute(
                select(LeaderLease.holder, LeaderLease.epoch, LeaderLease.expires_s)
                .where(LeaderLease.id == LEASE_ID)
                .with_for_update()
            ).first()
            expires = now + self.lease_s
            if row is None:
                first = self.highest_epoch + 1
                conn.execute(
                    insert(LeaderLease).values(
                        id=LEASE_ID,
                        holder=self.holder,
                        epoch=first,
                        expires_s=expires,
                        acquired_s=now,
                    )
                )
                self.highest_epoch = first
                return first
            holder, epoch, until = row
            seen, self.highest_epoch = self.highest_epoch, max(self.highest_epoch, int(epoch))
            if holder == self.holder and epoch == self.epoch:
                conn.execute(
                    update(LeaderLease)
                    .where(LeaderLease.id == LEASE_ID, LeaderLease.epoch == epoch)
                    .values(expires_s=expires)
                )
                return int(epoch)
            if self.epoch is not None:  # it thought it led: its renewal is a refused write
                self._refused(f"lease renewal of epoch {self.epoch}", int(epoch), holder)
                self.epoch = None
            if until > now and not self.exclusive:
                return None
            if seen > epoch:
                log.warning(
                    "the lease row went back in time (epoch %d, this replica saw %d): the "
                    "database was restored or a lagging standby promoted; the next epoch is %d",
                    epoch,
                    seen,
                    seen + 1,
                )
            new = max(int(epoch), seen) + 1
            conn.execute(
                update(LeaderLease)
                .where(LeaderLease.id == LEASE_ID, LeaderLease.epoch == epoch)
                .values(holder=self.holder, epoch=new, expires_s=expires, acquired_s=now)
            )
            self.highest_epoch = new
            return new

    def _db_now(self, conn: Connection) -> float:
        """The database's clock (PostgreSQL), so every replica judges expiry alike."""
        if self.postgres:
            q = "SELECT extract(epoch from clock_timestamp())"
            return float(conn.exec_driver_sql(q).scalar_one())
        return time.time()

    def _refused(self, what: str, epoch: int, holder: str) -> None:
        self.refusals += 1
        log.warning(
            "fencing token refused %s by %s: the lease is at epoch %d (held by %s)",
            what,
            self.holder,
            epoch,
            holder,
        )

    # -- the fence ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def fenced(self) -> Iterator[int]:
        """Leader work: every transaction begun inside (on this thread) checks the epoch first;
        yields that epoch. Raises `NotLeading` at once when this replica does not lead."""
        mine = self.epoch
        if mine is None or not self.is_leader:
            raise NotLeading(f"{self.holder} does not lead")
        prev = getattr(self._local, "epoch", None)
        self._local.epoch = mine
        try:
            yield mine
        finally:
            self._local.epoch = prev

    def wrap(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn`` run inside `fenced` (for commands handed to the writer thread)."""

        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with self.fenced():
                return fn(*args, **kwargs)

        return run

    def _on_begin(self, conn: Connection) -> None:
        mine = getattr(self._local, "epoch", None)
        if mine is None:
            return
        q = select(LeaderLease.epoch, LeaderLease.holder).where(LeaderLease.id == LEASE_ID)
        if self.postgres:
            # a stopped leader must not hold the share lock (and so the takeover) for long
            ms = int(self.lease_s * 1000)
            conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")
            q = q.with_for_update(read=True)
        row = conn.execute(q).first()
        # the holder too: after the row went back in time another replica may hold this very
        # epoch number (`highest_epoch` keeps this replica's own takeovers past it)
        if row is None or row[0] != mine or row[1] != self.holder:
            epoch, holder = (int(row[0]), str(row[1])) if row is not None else (0, "nobody")
            self._refused(f"a write of epoch {mine}", epoch, holder)
            with self._lock:
                if self.epoch == mine:
                    self.epoch = None
            raise StaleLeader(f"{self.holder}: epoch {mine} is over (the lease is at {epoch})")
