"""An agent's report of an update or a power order (`gpufleet.agent.report_post.post_report`):
sent again while the controller gives no answer or a 5xx, recorded as done once it answered for
good (taken, or refused with a 4xx that a repeat would only meet again)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.report_post import post_report
from gpufleet.wire import WireUpdateReport


def _report() -> WireUpdateReport:
    return WireUpdateReport(key="c1.n1", node="n1", exit_code=0, output_tail="done")


def _post(tmp_path: Path, answer: httpx.MockTransport) -> tuple[bool, Path]:
    reported = tmp_path / "reported.json"
    with httpx.Client(transport=answer) as client:
        done = post_report(client, "http://ctl/api/v1/x", {}, _report(), reported, "update")
    return done, reported


def test_no_answer_is_tried_again_and_records_nothing(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    done, reported = _post(tmp_path, httpx.MockTransport(refuse))
    assert done is False and not reported.exists()


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_error_is_tried_again(tmp_path: Path, status: int) -> None:
    done, reported = _post(tmp_path, httpx.MockTransport(lambda r: httpx.Response(status)))
    assert done is False and not reported.exists()


@pytest.mark.parametrize("status", [200, 409, 422])
def test_an_answer_for_good_is_recorded_privately(tmp_path: Path, status: int) -> None:
    sent: list[dict[str, object]] = []

    def take(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(status, text="no" if status >= 400 else "")

    done, reported = _post(tmp_path, httpx.MockTransport(take))
    assert done is True and sent[0]["key"] == "c1.n1"
    assert json.loads(reported.read_text()) == {"status": status}
    assert stat.S_IMODE(reported.stat().st_mode) == 0o600
