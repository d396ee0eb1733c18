"""Where the controller's notifications go: webhooks (JSON signed with HMAC-SHA256, or a
Slack-compatible ``{"text": ...}`` payload) and email over SMTP (stdlib ``smtplib``).

Each ``deliver`` makes one attempt and raises `DeliveryError` saying whether a retry can help;
the retries, their backoff and the thread they run on belong to `gpufleet.control.notify.notifier`.

Signature (like GitHub's and Slack's webhooks): header ``X-Gpufleet-Signature: sha256=HEX``
where HEX = HMAC-SHA256(secret, ``TIMESTAMP + "." + BODY``) and TIMESTAMP is the
``X-Gpufleet-Timestamp`` header (Unix seconds), so a receiver can refuse old replays.
``X-Gpufleet-Id`` is the notification's id: the same on every retry, for de-duplication.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import time
from collections.abc import Collection
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from gpufleet.control.notify.config import EmailConfig, WebhookConfig
    from gpufleet.control.notify.notification import Notification

SIGNATURE_HEADER = "X-Gpufleet-Signature"
TIMESTAMP_HEADER = "X-Gpufleet-Timestamp"
ID_HEADER = "X-Gpufleet-Id"
EVENT_HEADER = "X-Gpufleet-Event"
ATTEMPT_HEADER = "X-Gpufleet-Attempt"


class DeliveryError(Exception):
    """One attempt failed; ``retry``: whether trying again later can succeed."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class Sink(Protocol):
    """One destination."""

    name: str

    def wants(self, n: Notification) -> bool: ...

    def deliver(self, n: Notification, attempt: int) -> None: ...


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=HEX`` over ``timestamp.body`` (see the module docstring)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def safe_url(url: str) -> str:
    """What of a URL may be logged: scheme, host and port (paths of Slack-style webhook URLs
    are secrets)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _wants(events: Collection[str] | None, states: Collection[str] | None, n: Notification) -> bool:
    if events is not None and n.kind not in events:
        return False
    if states is not None and n.kind == "node_state":
        return str(n.data.get("to")) in states
    return True


def slack_text(n: Notification) -> str:
    """One line for a chat channel."""
    icon = {2: ":red_circle:", 1: ":warning:"}.get(n.severity, ":information_source:")
    where = f" {n.node}" if n.node else ""
    return f"{icon} gpufleet{where}: {n.summary} (id {n.id})"


class WebhookSink:
    """POST each notification to one URL."""

    def __init__(self, cfg: WebhookConfig, secret: bytes | None, client: httpx.Client) -> None:
        self.url = cfg.url
        self.name = f"webhook {safe_url(cfg.url)}"
        self.format = cfg.format
        self.events, self.states, self.timeout_s = cfg.events, cfg.states, cfg.timeout_s
        self._secret = secret
        self._client = client

    def __repr__(self) -> str:  # never the secret, never the URL's path
        return f"WebhookSink({safe_url(self.url)}, format={self.format})"

    def wants(self, n: Notification) -> bool:
        return _wants(self.events, self.states, n)

    def body(self, n: Notification) -> dict[str, Any]:
        if self.format == "slack":
            return {"text": slack_text(n)}
        return n.to_json()

    def deliver(self, n: Notification, attempt: int) -> None:
        body = json.dumps(self.body(n), sort_keys=True).encode()
        ts = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            ID_HEADER: n.id,
            EVENT_HEADER: n.kind,
            ATTEMPT_HEADER: str(attempt),
            TIMESTAMP_HEADER: ts,
        }
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, ts, body)
        try:
            r = self._client.post(self.url, content=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise DeliveryError(f"{type(exc).__name__}", retry=True) from None
        if 200 <= r.status_code < 300:
            return
        # 408/429 and 5xx are the receiver's temporary trouble; other 4xx will not change
        retry = r.status_code >= 500 or r.status_code in (408, 429)
        raise DeliveryError(f"HTTP {r.status_code}", retry=retry)


class EmailSink:
    """One message per notification through an SMTP relay."""

    def __init__(self, cfg: EmailConfig, password: str | None) -> None:
        self.cfg = cfg
        self.name = f"smtp {cfg.host}:{cfg.port}"
        self._password = password

    def __repr__(self) -> str:
        return f"EmailSink({self.cfg.host}:{self.cfg.port} -> {len(self.cfg.to)} recipients)"

    def wants(self, n: Notification) -> bool:
        return _wants(self.cfg.events, self.cfg.states, n)

    def message(self, n: Notification) -> EmailMessage:
        msg = EmailMessage()
        where = f" {n.node}" if n.node else ""
        msg["Subject"] = f"[gpufleet]{where} {n.summary}"[:200]
        msg["From"] = self.cfg.sender
        msg["To"] = ", ".join(self.cfg.to)
        # the same Message-ID on every retry: mail systems drop the duplicate
        msg["Message-ID"] = f"<{n.id}@gpufleet>"
        msg["X-Gpufleet-Id"] = n.id
        msg["X-Gpufleet-Event"] = n.kind
        msg.set_content(f"{n.summary}\n\n{json.dumps(n.to_json(), indent=2, sort_keys=True)}\n")
        return msg

    def deliver(self, n: Notification, attempt: int) -> None:
        cfg = self.cfg
        try:
            smtp: smtplib.SMTP
            if cfg.ssl:
                smtp = smtplib.SMTP_SSL(
                    cfg.host, cfg.port, timeout=cfg.timeout_s, context=ssl.create_default_context()
                )
            else:
                smtp = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s)
            with smtp:
                if cfg.starttls and not cfg.ssl:
                    smtp.starttls(context=ssl.create_default_context())
                if cfg.username and self._password is not None:
                    smtp.login(cfg.username, self._password)
                smtp.send_message(self.message(n))
        except smtplib.SMTPResponseException as exc:
            # 4xx replies are temporary (RFC 5321, section 4.2.1); 5xx are permanent
            raise DeliveryError(f"SMTP {exc.smtp_code}", retry=400 <= exc.smtp_code < 500) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryError(type(exc).__name__, retry=True) from None
