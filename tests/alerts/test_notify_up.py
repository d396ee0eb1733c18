"""`gpufleet up --notify FILE` (issue 29: only `gpufleet controller` had it): a real `up`
process on a simulated fleet whose node n2 has a GPU off the bus from the start sends the
node's signed move out of validating to a real webhook receiver; a notification file that
does not parse stops `up` with one line naming it, before a database is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.testing.testbed import free_port
from tests.alerts.receivers import WebhookReceiver

pytestmark = pytest.mark.process

SECRET = b"up-webhook-signing-key"
SRC = Path(__file__).resolve().parents[2] / "src"


def _up(tmp_path: Path, notify: Path, port: int) -> subprocess.Popen[bytes]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        json.dumps(
            {
                "nodes": [{"name": n, "model": "h100-sxm", "gpus": 2} for n in ("n1", "n2")],
                "faults": [{"node": "n2", "kind": "fallen_off_bus", "gpu": 1, "at_s": 0.0}],
            }
        ),
        encoding="utf-8",
    )
    args = [sys.executable, "-m", "gpufleet", "up", "--sim", str(fleet), "--port", str(port)]
    args += ["--data-dir", str(tmp_path / "data"), "--notify", str(notify)]
    env = {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    log = (tmp_path / "up.log").open("wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)


def test_up_sends_signed_node_events_to_the_webhook(tmp_path: Path) -> None:
    secret = tmp_path / "hook.secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    rx = WebhookReceiver()
    notify = tmp_path / "notify.yaml"
    notify.write_text(
        f"webhooks:\n  - url: {rx.url}\n    secret_file: {secret}\n", encoding="utf-8"
    )
    up = _up(tmp_path, notify, free_port())
    try:

        def n2_out_of_validating(r: WebhookReceiver) -> bool:
            return any(
                a.json()["kind"] == "node_state"
                and a.json()["node"] == "n2"
                and a.json()["data"]["from"] == "validating"
                for a in r.accepted.values()
            )

        rx.wait(n2_out_of_validating, timeout_s=90)
        up.terminate()
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        rx.close()
    out = [
        a.json()
        for a in rx.accepted.values()
        if a.json()["kind"] == "node_state" and a.json()["node"] == "n2"
    ]
    moves = [(e["data"]["from"], e["data"]["to"]) for e in out]
    assert ("validating", "draining") in moves or ("validating", "repair") in moves, moves
    assert all(a.signed_by(SECRET) for a in rx.accepted.values())
    assert SECRET.decode() not in (tmp_path / "up.log").read_text()


def test_up_with_a_bad_notify_file_stops_naming_it(tmp_path: Path) -> None:
    notify = tmp_path / "notify.yaml"
    notify.write_text("webhooks: [{url: 7}]\n", encoding="utf-8")
    up = _up(tmp_path, notify, free_port())
    assert up.wait(60) != 0
    text = (tmp_path / "up.log").read_text()
    assert "notify.yaml" in text and "Traceback" not in text, text
    assert not list((tmp_path / "data").glob("*.db"))
