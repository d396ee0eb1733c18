"""The overview's Notifications panel (issue 29) in a real browser: a real controller process
with ``--notify`` whose webhook nobody answers, and a node registering over HTTP (its state
changes are notified). The admin's page shows the receiver with the outbox's figures (the API's own,
read once they settle) and the last error; a viewer's page leaves the panel out (the status is
for global operators and admins)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.testbed import free_port, wait_for
from tests.control.conftest import batch

pytestmark = [pytest.mark.slow, pytest.mark.process]

NODE = "notify-0"


def _status(ctl: ControllerProcess, token: str) -> dict[str, Any]:
    r = httpx.get(
        f"{ctl.url}/api/v1/notifications/status",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def test_the_overview_shows_each_receivers_outbox(tmp_path: Path, page: Any) -> None:
    data = tmp_path / "data"
    tokens = create_tokens(
        data, {"admin": ("admin", None), "viewer": ("viewer", None), "agent": ("agent", NODE)}
    )
    notify = tmp_path / "notify.yaml"
    dead_port = free_port()  # nothing listens there: every attempt is refused
    notify.write_text(
        f"webhooks:\n  - url: http://127.0.0.1:{dead_port}/hook\n"
        "retry: {attempts: 2, backoff_s: 0.2, max_backoff_s: 0.5}\n",
        encoding="utf-8",
    )
    ctl = ControllerProcess(data, tokens["admin"], scheduler="none", args=["--notify", str(notify)])
    ctl.start()
    try:
        r = httpx.post(
            f"{ctl.url}/api/v1/ingest",
            json=batch(NODE, 1, t=time.time()),
            headers={"Authorization": f"Bearer {tokens['agent']}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text

        # the node's move (registering -> validating) is notified; with two refused attempts
        # it ends dead-lettered, none left pending
        def settled() -> dict[str, Any] | None:
            doc = _status(ctl, tokens["admin"])
            rs = doc["receivers"]
            done = len(rs) == 1 and rs[0]["dead"] >= 1 and rs[0]["pending"] == 0
            return rs[0] if done else None

        want = wait_for(settled, 60, "the notifications dead-lettered", step_s=0.3)
        assert isinstance(want, dict)
        page.goto(ctl.url + f"/#token={tokens['admin']}")
        row = page.wait_for_selector("#notify-panel:not([hidden]) #notify-table tbody tr")
        assert row is not None
        cells = {
            c: page.inner_text(f"#notify-table [data-col={c}]")
            for c in ("pending", "delivered", "failed_attempts", "dead", "last_error")
        }
        assert cells == {
            "pending": "0",
            "delivered": "0",
            "failed_attempts": str(want["failed_attempts"]),
            "dead": str(want["dead"]),
            "last_error": "ConnectError",
        }
        assert row.get_attribute("data-receiver") == f"webhook http://127.0.0.1:{dead_port}"
        assert "row-h2" in (row.get_attribute("class") or "")  # dead letters: marked bad
        assert "/hook" not in page.inner_text("#notify-panel")  # a URL's path may be a secret

        page.goto(ctl.url + f"/#token={tokens['viewer']}")
        page.reload()  # a new page load adopts the viewer's token
        page.wait_for_selector("#attention")
        page.wait_for_timeout(500)  # the status call has come back (403) by then
        assert page.eval_on_selector("#notify-panel", "e => e.hidden") is True
    finally:
        ctl.stop()
