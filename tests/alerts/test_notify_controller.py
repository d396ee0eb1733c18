"""End to end (issue 18): a real ``gpufleet controller --notify FILE`` process and a real
``gpufleet agent`` process whose simulated GPU is off the bus from the start: the controller
takes the node out of validating (its fail finding drains it). The webhook receiver in this
test answers HTTP 500 to the first attempt of every notification, and still gets each signed
event (the node's moves, the circuit breaker) exactly once by its id, each retried once and
never sent again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpufleet.testing.procs import AgentProcess, create_tokens
from gpufleet.testing.testbed import free_port, wait_for
from tests.alerts.receivers import WebhookReceiver

pytestmark = pytest.mark.process


SECRET = b"webhook-signing-key-for-the-test"


def test_controller_process_sends_signed_node_events_once(tmp_path: Path) -> None:
    data = tmp_path / "ctl"
    data.mkdir(mode=0o700)
    tokens = create_tokens(data, {"admin": ("admin", None), "agent": ("agent", "node-n1")})
    secret = tmp_path / "hook.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    rx = WebhookReceiver(fail_first=True)
    notify = tmp_path / "notify.yaml"
    notify.write_text(
        f"webhooks:\n  - url: {rx.url}\n    secret_file: {secret}\n"
        "retry: {attempts: 5, backoff_s: 0.3, max_backoff_s: 2}\n",
        encoding="utf-8",
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text("max_out_fraction: 1.0\n", encoding="utf-8")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    log = (tmp_path / "controller.log").open("wb")
    ctl = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpufleet", "controller", "--data-dir", str(data)),
            *("--port", str(port), "--policy", str(policy), "--notify", str(notify)),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    agent = AgentProcess(
        "node-n1",
        url,
        tokens["agent"],
        tmp_path / "agent",
        faults=[{"kind": "fallen_off_bus", "gpu": 1, "at_s": 0.0}],
    )
    try:
        wait_for(
            lambda: httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200,
            60,
            "controller up",
        )
        agent.start()

        def out_of_validating(r: WebhookReceiver) -> bool:
            return any(
                a.json()["kind"] == "node_state" and a.json()["data"]["from"] == "validating"
                for a in r.accepted.values()
            )

        rx.wait(out_of_validating, timeout_s=90)
        agent.stop()
        ctl.terminate()
        ctl.wait(30)  # the notifier delivers what is queued before the process ends
    finally:
        agent.stop()
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
        log.close()
        rx.close()
    log_text = (tmp_path / "controller.log").read_text()
    assert SECRET.decode() not in log_text and "s3cr3t-path" not in log_text
    node_events = [a for a in rx.accepted.values() if a.json()["kind"] == "node_state"]
    moves = [(a.json()["data"]["from"], a.json()["data"]["to"]) for a in node_events]
    assert ("registering", "validating") in moves, moves
    out = [a.json() for a in node_events if a.json()["data"]["from"] == "validating"]
    assert len(out) == 1 and out[0]["data"]["to"] in ("draining", "repair"), moves
    assert out[0]["node"] == "node-n1" and out[0]["severity"] == "warning", out
    assert out[0]["summary"].startswith(f"validating -> {out[0]['data']['to']}: "), out
    assert len(moves) == len(set(moves)), moves  # one notification per move
    for accepted in rx.accepted.values():
        assert accepted.signed_by(SECRET)
        tries = [a for a in rx.attempts if a.id == accepted.id]
        # the first attempt got HTTP 500, the retry went through, nothing was sent after it
        assert [a.status for a in tries] == [500, 200], accepted.id
        assert [a.headers["x-gpufleet-attempt"] for a in tries] == ["1", "2"]
        assert tries[0].body == tries[1].body
