"""The durable notification outbox (issue 29) on the real SQLite (and PostgreSQL for the
claims): rows written in the event's own transaction and only for a commit, retries with
capped backoff then delivery, dead letters (attempts spent, refused for good, too old), rows a
stopped process left delivered at the next start, one lane per receiver (a hung one delays
no other), claims that let one controller at a time send a row, retention, and the status
route's answer and roles."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from gpufleet.control.db.engine import make_engine, migrate, session_factory
from gpufleet.control.db.models import NotificationOutbox, ValidationResultRow
from gpufleet.control.notify.config import RetryConfig
from gpufleet.control.notify.durable import OutboxNotifier, receiver_names
from gpufleet.control.notify.notification import Notification
from gpufleet.control.notify.notifier import Notifier, record_event
from gpufleet.control.notify.outbox import DEAD, DELIVERED, PENDING, Outbox, status
from gpufleet.control.notify.sinks import DeliveryError
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.store import ControlStore
from tests.control.conftest import pg_url  # noqa: F401  (the session's PostgreSQL fixture)
from tests.waiting import wait_until

FAST = RetryConfig(attempts=4, backoff_s=0.05, max_backoff_s=0.1)


class Scripted:
    """A receiver that answers each attempt from a script (an exception or None: delivered),
    then delivers; records (id, attempt)."""

    def __init__(self, name: str, script: list[DeliveryError | None] | None = None) -> None:
        self.name = name
        self.script = list(script or [])
        self.got: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def wants(self, n: Notification) -> bool:
        return True

    def deliver(self, n: Notification, attempt: int) -> None:
        with self.lock:
            self.got.append((n.id, attempt))
            step = self.script.pop(0) if self.script else None
        if step is not None:
            raise step

    def ids(self) -> list[str]:
        with self.lock:
            return [i for i, _ in self.got]


class Hung(Scripted):
    """Every attempt blocks until the test releases it (a webhook that hangs)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = threading.Event()

    def deliver(self, n: Notification, attempt: int) -> None:
        self.release.wait(30)
        super().deliver(n, attempt)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated database, copied for each test (migrating costs ~0.3 s of CPU a time)."""
    path = tmp_path_factory.mktemp("outbox") / "template.sqlite"
    eng = make_engine(f"sqlite:///{path}")
    migrate(eng)
    eng.dispose()
    return path


@pytest.fixture
def engine(tmp_path: Path, migrated: Path) -> Iterator[Engine]:
    shutil.copyfile(migrated, tmp_path / "db.sqlite")
    eng = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield eng
    eng.dispose()


def _port(engine: Engine, sinks: list[Any], retry: RetryConfig = FAST, **kw: Any) -> OutboxNotifier:
    return OutboxNotifier(Notifier(sinks, retry=retry), engine, "db1", **kw)


def _events(store: ControlStore, count: int, *, start: int = 0) -> None:
    for i in range(start, start + count):
        with store.sessions.begin() as s:
            record_event(s, "maintenance_step_failed", node=f"n{i}", message=f"m{i}", now_s=5.0)


def _rows(engine: Engine) -> list[NotificationOutbox]:
    with session_factory(engine)() as s:
        return list(s.scalars(select(NotificationOutbox).order_by(NotificationOutbox.id)))


def test_rows_are_written_in_the_event_transaction_and_only_for_a_commit(engine: Engine) -> None:
    store = ControlStore(engine, clock=lambda: 5.0)
    a, b = Scripted("webhook http://a"), Scripted("webhook http://a")
    port = _port(engine, [a, b])  # lanes not started: the rows alone
    store.tell(port)
    with store.sessions.begin() as s:
        record_event(s, "maintenance_step_failed", node="gpu-01", message="flash failed", now_s=5.0)
        s.add(ValidationResultRow(node="g2", verdict="pass", received_s=6.0, actor="x"))
    with pytest.raises(RuntimeError), store.sessions.begin() as s:
        record_event(s, "circuit_breaker_open", message="rolled back", now_s=7.0)
        s.flush()
        raise RuntimeError("abort")
    rows = _rows(engine)
    # one per receiver (two webhooks on one host are told apart), none for the rollback
    assert [(r.receiver, r.state, r.attempts) for r in rows] == [
        ("webhook http://a", PENDING, 0),
        ("webhook http://a #2", PENDING, 0),
    ]
    assert rows[0].notification_id == rows[1].notification_id == rows[0].payload["id"]
    assert rows[0].notification_id.startswith("gf-db1-ev")
    assert rows[0].payload["kind"] == "maintenance_step_failed"
    assert receiver_names([a, b]) == ["webhook http://a", "webhook http://a #2"]


def test_retries_back_off_then_deliver_and_dead_letters_are_counted(engine: Engine) -> None:
    store = ControlStore(engine, clock=lambda: 5.0)
    flaky = Scripted(
        "flaky", [DeliveryError("HTTP 500", retry=True), DeliveryError("HTTP 503", retry=True)]
    )
    down = Scripted("down", [DeliveryError("ConnectError", retry=True)] * 10)
    refused = Scripted("refused", [DeliveryError("HTTP 404", retry=False)])
    port = _port(engine, [flaky, down, refused])
    store.tell(port.start())
    try:
        _events(store, 1)
        assert port.flush(10)
    finally:
        port.stop(timeout_s=2)
    nid = _rows(engine)[0].notification_id
    assert flaky.got == [(nid, 1), (nid, 2), (nid, 3)]  # the attempt number goes on
    assert down.got == [(nid, a) for a in (1, 2, 3, 4)]  # FAST: 4 attempts in all
    assert refused.got == [(nid, 1)]  # a 404 will not change: no retry
    by = {r.receiver: r for r in _rows(engine)}
    assert by["flaky"].state == DELIVERED and by["flaky"].attempts == 3
    assert by["down"].state == DEAD and by["down"].last_error == "ConnectError"
    assert by["refused"].state == DEAD and by["refused"].attempts == 1
    assert port.stats == {"delivered": 1, "retried": 5, "dead": 2}
    with session_factory(engine)() as s:
        got = {r["receiver"]: r for r in status(s, now_s=1e12)}
    assert got["flaky"]["delivered"] == 1 and got["flaky"]["failed_attempts"] == 2
    assert got["flaky"]["last_error"] == "HTTP 503"
    assert got["down"]["dead"] == 1 and got["down"]["failed_attempts"] == 4
    assert got["down"]["pending"] == 0 and got["down"]["oldest_pending_age_s"] is None


def test_backoff_doubles_up_to_its_cap() -> None:
    retry = RetryConfig(attempts=10, backoff_s=1.0, max_backoff_s=5.0)
    port = _port(make_engine("sqlite://"), [], retry)  # nothing read or written
    for attempt, want in zip(range(1, 6), [1, 2, 4, 5, 5], strict=True):
        assert want * 0.9 <= port.backoff_s(attempt) <= want * 1.1


def test_a_notification_older_than_max_age_is_dead_lettered_unsent(engine: Engine) -> None:
    now = [1000.0]
    store = ControlStore(engine, clock=lambda: now[0])
    rx = Scripted("rx")
    retry = RetryConfig(attempts=5, backoff_s=0.05, max_backoff_s=0.1, max_age_s=60)
    writer = _port(engine, [rx], retry, clock=lambda: now[0])
    store.tell(writer)  # written at t=1000, never sent by this one
    _events(store, 1)
    now[0] = 1061.0  # the controller was down for longer than max_age_s
    port = _port(engine, [rx], retry, clock=lambda: now[0]).start()
    try:
        assert port.flush(10)
    finally:
        port.stop(timeout_s=2)
    (row,) = _rows(engine)
    assert rx.got == [] and row.state == DEAD and (row.last_error or "").startswith("expired")


def test_rows_left_by_a_stopped_process_go_out_at_the_next_start(engine: Engine) -> None:
    """What a killed controller left: pending rows, one of them claimed mid-attempt (its
    claim still running). SQLite has one controller, so the next start drops the claim and
    sends every row, the claimed one again under the same id."""
    store = ControlStore(engine, clock=lambda: 5.0)
    store.tell(_port(engine, [Scripted("rx")]))  # lanes never started: the "killed" process
    _events(store, 5)
    dead_one = Outbox(session_factory(engine), "killed:1")
    claimed = dead_one.claim_next("rx", now_s=1e10, claim_s=1e10)
    assert claimed is not None
    rx = Scripted("rx")
    port = _port(engine, [rx]).start()
    try:
        assert port.flush(10)
    finally:
        port.stop(timeout_s=2)
    ids = [r.notification_id for r in _rows(engine)]
    assert rx.ids() == ids and claimed.notification_id in ids  # in order, each once
    assert all(r.state == DELIVERED for r in _rows(engine))
    assert not dead_one.delivered(claimed.id, 1, 1.0)  # its lost claim writes nothing


def test_a_hung_receiver_delays_no_other(engine: Engine) -> None:
    store = ControlStore(engine, clock=lambda: 5.0)
    hung, healthy = Hung("hung"), Scripted("healthy")
    port = _port(engine, [hung, healthy])
    store.tell(port.start())
    try:
        _events(store, 20)

        def by_receiver() -> dict[str, Any]:
            with session_factory(engine)() as s:
                return {r["receiver"]: r for r in status(s, now_s=time.time())}

        assert wait_until(lambda: by_receiver()["healthy"]["delivered"] == 20, 20), healthy.got
        assert hung.got == [] and len(healthy.got) == 20
        got = by_receiver()
        assert got["hung"]["pending"] == 20
        assert got["hung"]["in_flight"] == 1  # the one it hangs on is claimed
        hung.release.set()
        assert port.flush(20)
        assert hung.ids() == healthy.ids()
    finally:
        hung.release.set()
        port.stop(timeout_s=2)


def _claims_one_at_a_time(engine: Engine) -> None:
    store = ControlStore(engine, clock=lambda: 5.0)
    store.tell(_port(engine, [Scripted("rx")], clock=lambda: 5.0))
    _events(store, 1)
    a = Outbox(session_factory(engine), "replica-a")
    b = Outbox(session_factory(engine), "replica-b")
    got = a.claim_next("rx", now_s=100.0, claim_s=40.0)
    assert got is not None
    assert b.claim_next("rx", now_s=120.0, claim_s=40.0) is None  # a holds it
    assert b.next_due_s("rx") == 140.0  # when a's claim ends
    took = b.claim_next("rx", now_s=141.0, claim_s=40.0)  # a died: its claim ran out
    assert took is not None and took.id == got.id
    assert not a.delivered(got.id, 1, 150.0)  # a's late mark is refused
    assert b.delivered(took.id, 1, 150.0)
    assert [r.state for r in _rows(engine)] == [DELIVERED]


def test_one_controller_at_a_time_claims_a_row_sqlite(engine: Engine) -> None:
    _claims_one_at_a_time(engine)


@pytest.mark.process
def test_one_controller_at_a_time_claims_a_row_postgresql(pg_url: str) -> None:  # noqa: F811
    name = f"outbox_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(pg_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        migrate(engine)
        _claims_one_at_a_time(engine)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}"'))
        admin.dispose()


def _data_dir(tmp_path: Path, migrated: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    shutil.copyfile(migrated, data / "gpufleet.db")
    return data


def test_retention_deletes_sent_rows_as_old_as_the_events(tmp_path: Path, migrated: Path) -> None:
    now = [1000.0]
    svc = ControlService(
        ServiceConfig(data_dir=_data_dir(tmp_path, migrated)), clock=lambda: now[0]
    )
    try:
        rx = Scripted("rx")
        port = _port(svc.engine, [rx], clock=lambda: now[0])
        svc.store.tell(port)
        _events(svc.store, 3)
        outbox = Outbox(session_factory(svc.engine), "me")
        for state in ("delivered", "dead"):
            c = outbox.claim_next("rx", now_s=1000.0, claim_s=10.0)
            assert c is not None
            getattr(outbox, state)(c.id, 1, 1000.0, *(() if state == "delivered" else ("x",)))
        now[0] = 1000.0 + 86400.0 * 31  # past the 30 days of event retention
        svc.apply_retention(rollups_s=1e9, batches_s=1e9, events_s=30 * 86400.0)
        assert [r.state for r in _rows(svc.engine)] == [PENDING]  # pending rows stay
    finally:
        svc.engine.dispose()


def test_status_route_answers_global_operators_only(tmp_path: Path, migrated: Path) -> None:
    from gpufleet.control.api.app import create_app

    config = ServiceConfig(data_dir=_data_dir(tmp_path, migrated))
    svc = ControlService(config, clock=lambda: 2000.0)
    try:
        port = _port(svc.engine, [Scripted("webhook http://hooks.example")], clock=lambda: 1990.0)
        svc.store.tell(port)
        _events(svc.store, 2)
        tokens = {
            role: svc.store.tokens.create(role, name=role)[0]
            for role in ("admin", "operator", "viewer")
        }
        tokens["tenant-admin"] = svc.store.tokens.create("admin", name="ta", tenant="ta")[0]
        with TestClient(create_app(svc)) as client:

            def get(token: str) -> Any:
                return client.get(
                    "/api/v1/notifications/status", headers={"Authorization": f"Bearer {token}"}
                )

            r = get(tokens["operator"])
            assert r.status_code == 200, r.text
            (rx,) = r.json()["receivers"]
            assert rx["receiver"] == "webhook http://hooks.example"
            assert (rx["pending"], rx["delivered"], rx["dead"], rx["in_flight"]) == (2, 0, 0, 0)
            assert rx["oldest_pending_age_s"] == 10.0 and rx["last_error"] is None
            assert get(tokens["admin"]).status_code == 200
            assert get(tokens["viewer"]).status_code == 403
            assert get(tokens["tenant-admin"]).status_code == 403
    finally:
        svc.engine.dispose()
