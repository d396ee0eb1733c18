"""`gpufleet config alertmanager` driven through Debian's real Alertmanager: alerts posted to
its API reach the webhook receivers of their severity and tenant (a small HTTP server in this
test), and a node's critical alert holds back the alerts of its GPUs (issue 18)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.agent.conftest import need_binary
from tests.control.conftest import free_port

runner = CliRunner()


class Receiver:
    """Webhook receiver: every POST body (Alertmanager's webhook JSON) by path."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.lock:
                    outer.got.setdefault(self.path, []).append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, path: str) -> set[tuple[str, str]]:
        """(alertname, instance/gpu) of every firing alert delivered to ``path``."""
        with self.lock:
            posts = list(self.got.get(path, []))
        return {
            (a["labels"]["alertname"], a["labels"].get("gpu", "-") + "@" + a["labels"]["instance"])
            for p in posts
            for a in p["alerts"]
            if a["status"] == "firing"
        }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def _config(tmp_path: Path, receiver: Receiver) -> Path:
    path = tmp_path / "alertmanager.yml"
    res = runner.invoke(
        app,
        [
            "config",
            "alertmanager",
            "--webhook",
            f"{receiver.url}/ops",
            "--critical-webhook",
            f"{receiver.url}/pager",
            "--tenant",
            f"acme={receiver.url}/acme",
            "--group-wait",
            "1s",
            "--group-interval",
            "1s",
            "--out",
            str(path),
        ],
    )
    assert res.exit_code == 0, res.output
    return path


@pytest.mark.process
def test_amtool_accepts_the_config_and_routes_by_severity_and_tenant(
    tmp_path: Path, receiver: Receiver
) -> None:
    amtool = need_binary("amtool", "prometheus-alertmanager")
    path = _config(tmp_path, receiver)
    out = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr

    def routes(*labels: str) -> str:
        res = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", *labels],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    assert routes("severity=critical") == "critical"
    assert routes("severity=warning") == "ops"
    assert routes("severity=critical", "tenant=acme") == "tenant-acme,critical"
    assert routes("severity=warning", "tenant=acme") == "tenant-acme,ops"
    assert routes("severity=warning", "tenant=other") == "ops"


def _alert(name: str, instance: str, severity: str, scope: str, **labels: str) -> dict[str, Any]:
    return {
        "labels": {
            "alertname": name,
            "instance": instance,
            "severity": severity,
            "scope": scope,
            **labels,
        },
        "annotations": {"summary": f"{name} on {instance}"},
    }


@pytest.mark.process
def test_real_alertmanager_delivers_by_route_and_inhibits_gpu_alerts(
    tmp_path: Path, receiver: Receiver
) -> None:
    binary = need_binary("prometheus-alertmanager", "prometheus-alertmanager")
    path = _config(tmp_path, receiver)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v2"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={path}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # one instance: no gossip port
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "am.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{api}/status", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "am.log").read_text()
            assert time.monotonic() < deadline, "alertmanager did not start"
            time.sleep(0.2)
        # node-b's agent is down: its GPU alert is held back; node-a's GPU alerts are not
        node_down = _alert("GpufleetAgentDown", "node-b:9400", "critical", "node")
        held = _alert("GpufleetGpuLost", "node-b:9400", "critical", "gpu", gpu="3")
        tenant_gpu = _alert("GpufleetGpuFailed", "node-a:9400", "critical", "gpu", gpu="0")
        tenant_gpu["labels"]["tenant"] = "acme"
        warning = _alert("GpufleetGpuWarning", "node-c:9400", "warning", "gpu", gpu="5")
        httpx.post(f"{api}/alerts", json=[node_down], timeout=5).raise_for_status()
        time.sleep(0.5)
        posted = httpx.post(f"{api}/alerts", json=[held, tenant_gpu, warning], timeout=5)
        posted.raise_for_status()

        want = {
            "/pager": {
                ("GpufleetAgentDown", "-@node-b:9400"),
                ("GpufleetGpuFailed", "0@node-a:9400"),
            },
            "/acme": {("GpufleetGpuFailed", "0@node-a:9400")},
            "/ops": {("GpufleetGpuWarning", "5@node-c:9400")},
        }
        deadline = time.monotonic() + 30
        while any(receiver.alerts(p) != w for p, w in want.items()):
            assert time.monotonic() < deadline, receiver.got
            time.sleep(0.2)
        time.sleep(3)  # several group intervals: the held-back alert stays held back
        for p, w in want.items():
            assert receiver.alerts(p) == w, (p, receiver.got)
        listed = httpx.get(f"{api}/alerts", params={"inhibited": "true"}, timeout=5).json()
        by_name = {a["labels"]["alertname"]: a["status"] for a in listed}
        assert by_name["GpufleetGpuLost"]["state"] == "suppressed"
        assert by_name["GpufleetGpuLost"]["inhibitedBy"]
        assert by_name["GpufleetGpuFailed"]["state"] == "active"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bad_options_are_usage_errors_naming_the_option() -> None:
    from gpufleet.errors import GpufleetError

    cases = [
        (["--webhook", "ops.example/hook"], "--webhook"),
        (["--webhook", "http://o/h", "--tenant", "acme"], "NAME=URL"),
        (["--webhook", "http://o/h", "--tenant", "a cme=http://t/h"], "NAME=URL"),
        (["--webhook", "http://o/h", "--tenant", "acme=t/h"], "--tenant"),
        (["--webhook", "http://o/h", "--tenant", "a=http://x", "--tenant", "a=http://y"], "twice"),
        (["--webhook", "http://o/h", "--group-wait", "soon"], "--group-wait"),
    ]
    for args, needle in cases:
        res = runner.invoke(app, ["config", "alertmanager", *args])
        assert isinstance(res.exception, GpufleetError), (args, res.output)
        assert res.exception.exit_code == 2 and needle in str(res.exception), args
    js = runner.invoke(app, ["config", "alertmanager", "--webhook", "http://o/h", "--json"])
    assert js.exit_code == 0, js.output
    doc = json.loads(js.output)
    assert [r["name"] for r in doc["receivers"]] == ["ops"]
    assert doc["inhibit_rules"][0]["equal"] == ["instance"]
