"""``gpufleet notify status``: the controller's notification outbox per receiver (pending,
delivered, failed attempts, dead-lettered, the oldest pending age, the last error), read from
``GET /api/v1/notifications/status`` with a global operator or admin token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.common import JsonOption, TokenFileOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json
from gpufleet.cli.process import CaOption
from gpufleet.cli.remote import BearerTokenOption, ControllerUrlOption, Remote
from gpufleet.wire.views import NotifyStatus

notify_app = typer.Typer(
    help="The controller's notifications (webhooks, email): delivery status.",
    no_args_is_help=True,
)


def notify_remote(
    controller: str = ControllerUrlOption,
    token: str | None = BearerTokenOption,
    token_file: Path | None = TokenFileOption,
    ca: Path | None = CaOption,
) -> Remote:
    """``--controller URL`` (needed), its token and ``--ca``."""
    return Remote(controller, token, token_file, ca)


def _age(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 120:
        return f"{v:.0f}s"
    return f"{v / 60:.0f}m" if v < 7200 else f"{v / 3600:.1f}h"


@notify_app.command("status")
@option_groups(remote=notify_remote)
def status(*, remote: Remote, as_json: bool = JsonOption) -> None:
    """Per receiver: pending (in flight), delivered, failed attempts, dead-lettered, the
    oldest pending notification's age and the last error."""
    with remote.client() as client:
        doc: Any = client.request("GET", "/notifications/status")
    st = NotifyStatus.model_validate(doc)
    if as_json:
        emit_json(st.model_dump(mode="json"))
        return
    if not st.receivers:
        console.print("no notifications in the outbox (no --notify, or nothing happened yet)")
        return
    console.print(  # one line a receiver (scripts grep it), however narrow the terminal
        f"{'receiver':<32} {'pending':>7} {'flight':>6} {'sent':>7} {'failed':>7} "
        f"{'dead':>5} {'oldest':>7}  last error",
        highlight=False,
        soft_wrap=True,
    )
    for r in st.receivers:
        console.print(
            f"{r.receiver[:32]:<32} {r.pending:>7} {r.in_flight:>6} {r.delivered:>7} "
            f"{r.failed_attempts:>7} {r.dead:>5} {_age(r.oldest_pending_age_s):>7}  "
            f"{r.last_error or '-'}",
            highlight=False,
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    app.add_typer(notify_app, name="notify")
