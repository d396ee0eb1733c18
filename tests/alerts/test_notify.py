"""The controller's notifications (issue 18): signed webhooks retried with backoff under one
id, the Slack payload, email through a local SMTP server, a bounded queue that never blocks
the caller, only committed rows notify, and configuration errors that name the field."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.control.db.engine import make_engine, migrate
from gpufleet.control.db.models import EventRow, ValidationResultRow
from gpufleet.control.notify.config import EmailConfig, RetryConfig, WebhookConfig, load_notify
from gpufleet.control.notify.notification import Notification
from gpufleet.control.notify.notifier import (
    Notifier,
    SessionNotifier,
    record_event,
)
from gpufleet.control.notify.sinks import EmailSink, WebhookSink
from gpufleet.control.state.store import ControlStore
from gpufleet.errors import ConfigError
from tests.alerts.receivers import SmtpReceiver, WebhookReceiver
from tests.control.conftest import free_port

SECRET = b"correct horse battery staple"
FAST = RetryConfig(attempts=4, backoff_s=0.2, max_backoff_s=1.0)


def note(i: int = 1, kind: str = "node_state", to: str = "lost") -> Notification:
    return Notification(
        id=f"test-{i}",
        kind=kind,
        at_s=1_700_000_000.0,
        summary=f"in_service -> {to}: heartbeats stopped",
        severity=2,
        node="gpu-07",
        data={"from": "in_service", "to": to},
    )


def _publish_one(notifier: Notifier) -> None:
    """Start ``notifier``, publish `note` and wait until it is done with it (delivered or given
    up), then stop it."""
    notifier.start()
    try:
        notifier.publish(note())
        assert notifier.flush(10)
    finally:
        notifier.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


@pytest.mark.process
def test_signed_webhook_retried_after_500_keeps_its_id(client: httpx.Client) -> None:
    rx = WebhookReceiver(fail_first=True)
    notifier = Notifier([WebhookSink(WebhookConfig(url=rx.url), SECRET, client)], retry=FAST)
    notifier.start()
    try:
        assert notifier.publish(note())
        rx.wait(lambda r: "test-1" in r.accepted)
        assert notifier.flush(5)
    finally:
        notifier.stop()
        rx.close()
    first, second = rx.attempts
    assert (first.status, second.status) == (500, 200)
    assert first.id == second.id == "test-1"
    assert (first.headers["x-gpufleet-attempt"], second.headers["x-gpufleet-attempt"]) == ("1", "2")
    assert first.signed_by(SECRET) and second.signed_by(SECRET)
    assert not second.signed_by(b"another secret")
    body = second.json()
    assert body["kind"] == "node_state" and body["node"] == "gpu-07"
    assert body["data"] == {"from": "in_service", "to": "lost"} and body["severity"] == "critical"
    assert body["at"] == "2023-11-14T22:13:20Z"
    assert notifier.stats["delivered"] == 1 and notifier.stats["retried"] == 1


def test_backoff_is_exponential_and_capped() -> None:
    n = Notifier([], retry=RetryConfig(attempts=10, backoff_s=1.0, max_backoff_s=5.0))
    waits = [n.backoff_s(a) for a in range(1, 6)]
    for got, want in zip(waits, [1, 2, 4, 5, 5], strict=True):
        assert want * 0.9 <= got <= want * 1.1


def test_dead_receiver_gives_up_after_the_attempts(client: httpx.Client) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: connection refused
    retry = RetryConfig(attempts=3, backoff_s=0.05, max_backoff_s=0.1)
    notifier = Notifier([WebhookSink(WebhookConfig(url=dead), None, client)], retry=retry)
    _publish_one(notifier)
    assert notifier.stats["retried"] == 2 and notifier.stats["failed"] == 1
    assert notifier.stats["delivered"] == 0


@pytest.mark.process
def test_slow_receiver_never_blocks_the_publisher(client: httpx.Client) -> None:
    """The writer thread only queues: publishing takes no time even when the receiver answers
    after 2 s, and a full queue drops (and counts) instead of waiting."""
    rx = WebhookReceiver(delay_s=2.0)
    sink = WebhookSink(WebhookConfig(url=rx.url, timeout_s=5), None, client)
    notifier = Notifier([sink], retry=FAST, queue_size=5)
    notifier.start()
    try:
        results = [notifier.publish(note(i)) for i in range(50)]
        with rx.lock:  # the receiver records an attempt only once its 2 s delay is over: a
            answered = len(rx.attempts)  # publish that waited on it could not return before
        assert answered == 0, f"publishing waited for {answered} answer(s)"
        assert results.count(False) >= 40 and notifier.stats["dropped"] == results.count(False)
    finally:
        notifier.stop(timeout_s=0.1)
        rx.close()


@pytest.mark.process
def test_slack_payload_and_filters(client: httpx.Client) -> None:
    rx = WebhookReceiver()
    cfg = WebhookConfig(url=rx.url, format="slack", states=["lost", "failed"])
    notifier = Notifier([WebhookSink(cfg, None, client)], retry=FAST)
    notifier.start()
    try:
        notifier.publish(note(1, to="draining"))  # filtered out by states
        notifier.publish(note(2, to="lost"))
        notifier.publish(note(3, kind="circuit_breaker_open"))  # states only filter node moves
        rx.wait(lambda r: len(r.accepted) == 2)
        assert notifier.flush(5)
    finally:
        notifier.stop()
        rx.close()
    assert set(rx.accepted) == {"test-2", "test-3"}
    body = rx.accepted["test-2"].json()
    assert list(body) == ["text"]
    assert "gpu-07" in body["text"] and "in_service -> lost" in body["text"]
    assert "x-gpufleet-signature" not in rx.accepted["test-2"].headers  # no secret, no signature


@pytest.mark.process
def test_email_through_a_local_smtp_server() -> None:
    smtp = SmtpReceiver()
    cfg = EmailConfig.model_validate(
        {"host": "127.0.0.1", "port": smtp.port, "from": "gf@example.org", "to": ["a@x", "b@x"]}
    )
    notifier = Notifier([EmailSink(cfg, None)], retry=FAST)
    try:
        _publish_one(notifier)
    finally:
        smtp.close()
    assert notifier.stats["delivered"] == 1
    (msg,) = smtp.messages
    assert msg["Message-ID"] == "<test-1@gpufleet>"
    assert msg["Subject"] == "[gpufleet] gpu-07 in_service -> lost: heartbeats stopped"
    assert msg["From"] == "gf@example.org"
    assert "heartbeats stopped" in msg.get_payload()
    assert smtp.envelopes[0][1] == ["<a@x>", "<b@x>"]


def test_only_committed_rows_notify_once(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    store = ControlStore(engine, clock=lambda: 5.0)
    sessions = store.sessions
    got: list[Notification] = []

    class Collect:
        name = "collect"

        def wants(self, n: Notification) -> bool:
            return True

        def deliver(self, n: Notification, attempt: int) -> None:
            got.append(n)

    notifier = Notifier([Collect()]).start()
    store.tell(SessionNotifier(notifier, "db1"))
    try:
        with sessions.begin() as s:
            record_event(
                s,
                "maintenance_step_failed",
                node="gpu-01",
                message="firmware update failed",
                now_s=5.0,
                data={"campaign": "c1", "step": "flash"},
            )
            s.add(EventRow(at_s=5.0, node="gpu-01", kind="finding", message="not notified"))
            s.add(
                ValidationResultRow(
                    node="gpu-02",
                    verdict="fail",
                    received_s=6.0,
                    actor="agent",
                    payload={"summary": "hbm bandwidth low"},
                )
            )
            s.add(
                ValidationResultRow(
                    node="gpu-03", verdict="pass", received_s=6.0, actor="agent", payload={}
                )
            )
        with pytest.raises(RuntimeError), sessions.begin() as s:
            record_event(s, "circuit_breaker_open", message="rolled back", now_s=7.0)
            s.flush()
            raise RuntimeError("abort")
        assert notifier.flush(5)
    finally:
        notifier.stop()
        engine.dispose()
    kinds = sorted((n.kind, n.node) for n in got)
    assert kinds == [("maintenance_step_failed", "gpu-01"), ("validation_failed", "gpu-02")]
    ids = {n.id for n in got}
    assert len(ids) == 2 and all(i.startswith("gf-db1-") for i in ids)
    failed = next(n for n in got if n.kind == "validation_failed")
    assert failed.summary == "validation failed: hbm bandwidth low"


def test_config_errors_name_the_field_and_never_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "hook.secret"
    secret.write_bytes(b"topsecretvalue\n")
    os.chmod(secret, 0o644)
    cfg = tmp_path / "notify.yaml"
    cfg.write_text(f"webhooks:\n  - url: https://h.example/x\n    secret_file: {secret}\n")
    from gpufleet.control.notify.notifier import build_notifier

    with pytest.raises(ConfigError) as err:
        build_notifier(load_notify(cfg), str(cfg))
    assert "readable by other users" in str(err.value) and "chmod 600" in str(err.value)
    assert "topsecretvalue" not in str(err.value)
    os.chmod(secret, 0o600)
    notifier = build_notifier(load_notify(cfg), str(cfg))
    assert "topsecretvalue" not in repr(notifier.sinks) and "/x" not in repr(notifier.sinks)
    notifier.stop()
    for text, needle in [
        ("webhooks:\n  - url: ftp://h/x\n", "webhooks.0.url"),
        ("webhooks:\n  - url: https://h/x\n    format: teams\n", "webhooks.0.format"),
        ("email:\n  - host: h\n    to: [a@x]\n", "email.0.from"),
        ("retry: {attempts: 0}\nwebhooks: [{url: 'https://h/x'}]\n", "retry.attempts"),
        ("webhook: []\n", "webhook"),
        ("{}\n", "nothing to notify"),
    ]:
        cfg.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_notify(cfg)
        assert str(cfg) in str(err.value) and needle in str(err.value), (text, str(err.value))


def test_controller_refuses_a_bad_notify_file_before_it_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.app import app
    from gpufleet.errors import GpufleetError

    bad = tmp_path / "notify.yaml"
    bad.write_text("webhooks:\n  - url: https://h/x\n    secret_file: /nonexistent/s\n")
    res = CliRunner().invoke(
        app, ["controller", "--data-dir", str(tmp_path / "d"), "--notify", str(bad)]
    )
    assert isinstance(res.exception, GpufleetError), res.output
    assert res.exception.exit_code == 2
    assert f"{bad}: webhooks.0" in str(res.exception) and "/nonexistent/s" in str(res.exception)
    assert not (tmp_path / "d").exists()  # nothing was created or started
