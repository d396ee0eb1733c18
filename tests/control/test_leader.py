"""Leader election and the fencing token (`gpufleet.control.ha.leader`) on the real databases:
one leader at a time, a takeover only after the lease expired, the epoch growing at every
change of holder, and every transaction of a stale leader refused before it writes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text, update

from gpufleet.control.db.engine import database_url, make_engine, migrate
from gpufleet.control.db.models import EventRow, LeaderLease
from gpufleet.control.ha.leader import Leadership, StaleLeader

from .conftest import _reset_pg


@pytest.fixture
def engine(db_config: dict[str, Any]) -> Engine:
    url = database_url(db_config.get("data_dir"), db_config.get("db_url"))
    eng = make_engine(url)
    migrate(eng)
    return eng


@pytest.fixture
def pg_engine(pg_url: str) -> Engine:
    """A migrated engine on the suite's PostgreSQL, emptied first (replicas need it: SQLite
    takes one controller per database, by its lock file)."""
    _reset_pg(pg_url)
    eng = make_engine(pg_url)
    migrate(eng)
    return eng


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Engine:
    eng = make_engine(database_url(tmp_path, None))
    migrate(eng)
    return eng


def _lease(engine: Engine) -> tuple[str, int]:
    with engine.connect() as c:
        row = c.execute(select(LeaderLease.holder, LeaderLease.epoch)).one()
    return str(row[0]), int(row[1])


def _write(engine: Engine, who: Leadership, kind: str) -> None:
    with who.fenced(), engine.begin() as c:
        c.execute(insert(EventRow).values(at_s=1.0, kind=kind, severity=0, message="", data={}))


def _kinds(engine: Engine) -> list[str]:
    with engine.connect() as c:
        return list(c.execute(select(EventRow.kind).order_by(EventRow.id)).scalars())


@pytest.mark.process
def test_one_leader_then_takeover_after_expiry_with_a_new_epoch(engine: Engine) -> None:
    exclusive = engine.dialect.name == "sqlite"
    a = Leadership(engine, lease_s=1.0, renew_s=0.2, exclusive=exclusive, holder="a")
    b = Leadership(engine, lease_s=1.0, renew_s=0.2, exclusive=exclusive, holder="b")
    assert a.step() is True and a.epoch == 1
    if not exclusive:  # PostgreSQL: b waits for a's lease
        assert b.step() is False and b.epoch is None
        assert a.step() is True  # renewal keeps the epoch
        assert _lease(engine) == ("a", 1)
        time.sleep(1.2)  # a stops renewing (killed, stopped): its lease runs out
    assert b.step() is True
    assert _lease(engine) == ("b", 2)
    _write(engine, b, "by-b")
    # a comes back believing it leads: its renewal and its writes are refused
    with pytest.raises(StaleLeader):
        _write(engine, a, "by-a")
    assert a.is_leader is False
    # SQLite: a's own lease still ran, so the database refused it; PostgreSQL: a's lease ran
    # out on its own clock, so it refused itself before asking
    assert a.refusals == (1 if exclusive else 0)
    with pytest.raises(StaleLeader):  # not even tried: it knows it does not lead
        _write(engine, a, "by-a-again")
    assert _kinds(engine) == ["by-b"]
    if not exclusive:  # (SQLite: the lock file makes whoever asks the only controller)
        assert a.step() is False
        assert _lease(engine) == ("b", 2)


def test_a_stale_leader_resumed_before_its_own_renewal_is_refused(
    pg_engine: Engine, tmp_path: Path
) -> None:
    """The SIGSTOP case in one process: a's local lease is still valid when it writes (its
    clock did not see the stop), the database's epoch moved on: the fence refuses."""
    engine = pg_engine
    a = Leadership(engine, lease_s=0.6, renew_s=0.2, holder="a")
    b = Leadership(engine, lease_s=0.6, renew_s=0.2, holder="b")
    assert a.step()
    time.sleep(0.7)
    assert b.step() and b.epoch == 2
    a._valid_until = time.monotonic() + 10  # as if its clock had not moved while stopped
    assert a.is_leader
    with pytest.raises(StaleLeader):
        _write(engine, a, "stale")
    assert a.refusals == 1
    assert "stale" not in _kinds(engine)


def test_a_leader_stopped_inside_its_transaction_does_not_block_the_takeover(
    pg_engine: Engine,
) -> None:
    """The fence's share lock would hold a takeover back while a stopped leader sits in its
    transaction: PostgreSQL ends that session after the lease (idle in transaction), the
    stopped leader's write is lost with it, and the other replica takes over."""
    engine = pg_engine
    a = Leadership(engine, lease_s=0.5, renew_s=0.2, holder="a")
    b = Leadership(engine, lease_s=0.5, renew_s=0.2, holder="b")
    assert a.step()
    outcome: list[str] = []
    inside = threading.Event()

    def stopped_leader_write() -> None:
        try:
            with a.fenced(), engine.begin() as c:
                c.execute(text("SELECT 1"))
                inside.set()
                time.sleep(1.0)  # "SIGSTOP" past its lease, inside its transaction
                row = {"at_s": 1, "kind": "a", "severity": 0, "message": "", "data": {}}
                c.execute(insert(EventRow).values(**row))
            outcome.append("committed")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    t = threading.Thread(target=stopped_leader_write)
    t.start()
    assert inside.wait(5)
    deadline = time.monotonic() + 3.0
    while not b.step():
        assert time.monotonic() < deadline, "the takeover waited for the stopped leader"
    t.join(10)
    assert outcome and outcome[0] != "committed"
    assert _kinds(engine) == []
    assert _lease(engine) == ("b", 2)


def test_a_leader_whose_renewal_fails_past_its_lease_steps_down_as_a_lapse(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its session ended by PostgreSQL while the process was stopped (or the database away):
    the renewal fails, not refused. Past its lease it leads no longer, counted and logged as a
    lapse (the HA chaos test's resumed leader shows one of the two); a failure inside the
    lease keeps the lead."""
    engine = pg_engine
    from sqlalchemy.exc import OperationalError

    a = Leadership(engine, lease_s=0.5, renew_s=0.1, holder="a")
    assert a.step() is True

    def broken() -> int | None:
        raise OperationalError("renew", {}, Exception("server closed the connection"))

    monkeypatch.setattr(a, "_attempt", broken)
    assert a.step() is True  # inside the lease: still leads
    assert (a.lapses, a.refusals) == (0, 0)
    time.sleep(0.6)
    with caplog.at_level("WARNING", logger="gpufleet.control"):
        assert a.step() is False
    assert a.epoch is None and (a.lapses, a.refusals) == (1, 0)
    assert "leads no longer: the lease of epoch 1 ran out" in caplog.text
    assert a.describe()["lapses"] == 1
    assert a.step() is False and a.lapses == 1  # counted once, not at every failed try


def test_the_lone_sqlite_controller_keeps_its_lead_when_renewals_are_held_up(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``exclusive`` (SQLite: the lock file's one controller): nobody can take over, so a
    renewal held up past the lease (a CPU-starved machine, a long write holding the database)
    is no reason to stop the leader's work; a CI run once saw a lone controller refuse its own
    writes so. The fence still refuses once the row shows another epoch."""
    from sqlalchemy.exc import OperationalError

    a = Leadership(sqlite_engine, lease_s=0.3, renew_s=0.1, exclusive=True, holder="a")
    assert a.step() is True

    def held_up() -> int | None:
        raise OperationalError("renew", {}, Exception("database is locked"))

    with monkeypatch.context() as m:
        m.setattr(a, "_attempt", held_up)
        time.sleep(0.4)
        assert a.step() is True and a.is_leader
    assert a.lapses == 0
    _write(sqlite_engine, a, "still-leads")
    b = Leadership(sqlite_engine, lease_s=0.3, renew_s=0.1, exclusive=True, holder="b")
    assert b.step() is True  # (an operator started another on the same file by force)
    with pytest.raises(StaleLeader):
        _write(sqlite_engine, a, "after-b")
    assert a.is_leader is False
    assert _kinds(sqlite_engine) == ["still-leads"]


def test_stop_hands_the_lease_over(pg_engine: Engine) -> None:
    engine = pg_engine
    a = Leadership(engine, lease_s=30.0, renew_s=1.0, holder="a")
    b = Leadership(engine, lease_s=30.0, renew_s=1.0, holder="b")
    a.start()
    assert a.is_leader and not b.step()
    a.stop()
    assert b.step() and b.epoch == 2


def test_bad_intervals_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="renew"):
        Leadership(engine, lease_s=1.0, renew_s=2.0)


def test_a_lease_row_gone_back_in_time_yields_no_second_leader(pg_engine: Engine) -> None:
    """A promoted standby that had not received the last change of holder (or a restored
    database) holds an older lease row. Before: the replica that had lost that older epoch took
    the next number, the very epoch the real leader still held, and both leaders' writes passed
    the fence (it compared epochs only). Now the fence compares the holder too, and a takeover
    goes past the highest epoch the replica has seen: tokens keep growing, one leader writes."""
    engine = pg_engine
    a = Leadership(engine, lease_s=0.5, renew_s=0.1, holder="a")
    b = Leadership(engine, lease_s=0.5, renew_s=0.1, holder="b")
    assert b.step() and b.epoch == 1
    time.sleep(0.6)  # b stops renewing; a takes over
    assert a.step() and a.epoch == 2
    assert b.step() is False and b.epoch is None  # b saw epoch 2 in the row
    # the database goes back in time: the row as it was under b's epoch 1, expired
    with engine.begin() as c:
        c.execute(update(LeaderLease).values(holder="b", epoch=1, expires_s=0.0))
    assert b.step() is True
    assert b.epoch == 3 and _lease(engine) == ("b", 3)  # past the 2 it had seen, not 2 again
    _write(engine, b, "by-b")
    with pytest.raises(StaleLeader):  # a's local lease has not run out: the fence refuses
        _write(engine, a, "by-a")
    assert _kinds(engine) == ["by-b"]


def test_the_fence_compares_the_holder_as_well_as_the_epoch(pg_engine: Engine) -> None:
    """Two replicas with the same epoch number (a replica that never saw the higher one, e.g.
    started after the switch): the one the row does not name is refused."""
    engine = pg_engine
    a = Leadership(engine, lease_s=30.0, renew_s=1.0, holder="a")
    assert a.step() and a.epoch == 1
    with engine.begin() as c:  # the row, as a lagging standby has it: someone else's epoch 1
        c.execute(update(LeaderLease).values(holder="c", epoch=1))
    with pytest.raises(StaleLeader):
        _write(engine, a, "by-a")
    assert _kinds(engine) == []
