"""The controller's notification settings (``gpufleet controller --notify FILE``): webhooks
(signed JSON or a Slack-compatible payload), email over SMTP, which events go where, retries.

::

    webhooks:
      - url: https://hooks.example.com/gpufleet
        secret_file: /etc/gpufleet/webhook.secret   # HMAC-SHA256 key (file mode 0600)
        events: [node_state, circuit_breaker_open, validation_failed, maintenance_step_failed]
        states: [lost, failed, draining, repair]    # node_state: only moves into these
      - url: https://hooks.slack.com/services/...
        format: slack
    email:
      - host: smtp.example.com
        port: 587
        starttls: true
        username: gpufleet
        password_file: /etc/gpufleet/smtp.password
        from: gpufleet@example.com
        to: [oncall@example.com]
    retry: {attempts: 6, backoff_s: 1, max_backoff_s: 300, max_age_s: 86400}
    queue_size: 1000

Secrets are read from files (never from the YAML itself, never logged) and a secret file that
other users can read is refused.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import ConfigError

EventKind = Literal[
    "node_state",
    "circuit_breaker_open",
    "circuit_breaker_closed",
    "validation_failed",
    "maintenance_step_failed",
]
EVENT_KINDS: tuple[str, ...] = EventKind.__args__  # type: ignore[attr-defined]


class _Sink(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    events: list[EventKind] | None = Field(None, description="Only these events (default all).")
    states: list[str] | None = Field(
        None, description="node_state events only for moves into these states (default all)."
    )
    timeout_s: float = Field(10.0, gt=0, le=120, description="One delivery attempt, at most.")


class WebhookConfig(_Sink):
    """One webhook receiver."""

    url: str
    secret_file: Path | None = Field(None, description="HMAC-SHA256 key; signs every POST.")
    format: Literal["json", "slack"] = "json"

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http(s):// URL")
        return v


class EmailConfig(_Sink):
    """One SMTP relay and its recipients."""

    host: str
    port: int = Field(25, ge=1, le=65535)
    starttls: bool = False
    ssl: bool = Field(False, description="SMTP over TLS from the start (port 465).")
    username: str | None = None
    password_file: Path | None = None
    sender: str = Field(alias="from")
    to: list[str] = Field(min_length=1)


class RetryConfig(BaseModel):
    """Exponential backoff: backoff_s, 2x, 4x ... capped at max_backoff_s; attempts in all. A
    notification still undelivered ``max_age_s`` after its event is dead-lettered too (the
    outbox keeps it across restarts, so a long outage would otherwise send day-old news)."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(6, ge=1, le=1000)
    backoff_s: float = Field(1.0, gt=0, le=3600)
    max_backoff_s: float = Field(300.0, gt=0, le=86400)
    max_age_s: float = Field(86400.0, gt=0, le=30 * 86400)


class NotifyConfig(BaseModel):
    """The whole ``--notify`` file."""

    model_config = ConfigDict(extra="forbid")

    webhooks: list[WebhookConfig] = Field(default_factory=list)
    email: list[EmailConfig] = Field(default_factory=list)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    queue_size: int = Field(1000, ge=1, le=1_000_000)


def read_secret(path: Path, where: str) -> bytes:
    """The secret in ``path`` (surrounding blanks stripped); refused when empty or readable by
    other users. The error names the file, never the content."""
    try:
        st = path.stat()
        raw = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{where}: {path}: {exc.strerror or exc}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{where}: {path}: readable by other users (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 600 {path}",
        )
    if not raw:
        raise ConfigError(f"{where}: {path}: empty")
    return raw


def load_notify(path: Path) -> NotifyConfig:
    """Read and check ``path``; errors name the file and the field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with webhooks/email")
    try:
        cfg = NotifyConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from exc
    if not cfg.webhooks and not cfg.email:
        raise ConfigError(f"{path}: no webhooks and no email: nothing to notify")
    return cfg
