"""`gpufleet config alertmanager` driven through Debian's real Alertmanager: alerts posted to
its API reach the webhook receivers of their severity and tenant (a small HTTP server in this
test); the most specific alert pages and the generic one of the same GPU or node is held
back (issues 18, 29)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.agent.conftest import need_binary
from tests.control.conftest import free_port
from tests.waiting import wait_truthy

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

    def firing(self, path: str) -> dict[tuple[str, str], dict[str, str]]:
        """The annotations of the last delivery of every firing alert to ``path``, by the
        keys of `alerts`."""
        with self.lock:
            posts = list(self.got.get(path, []))
        return {
            (
                a["labels"]["alertname"],
                a["labels"].get("gpu", "-") + "@" + a["labels"]["instance"],
            ): a["annotations"]
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


def _start_alertmanager(tmp_path: Path, config: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Debian's Alertmanager on ``config``, answering; (process, API v2 URL)."""
    binary = need_binary("prometheus-alertmanager", "prometheus-alertmanager")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v2"
    log = tmp_path / "am.log"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # one instance: no gossip port
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )

    def answers() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{api}/status", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_truthy(answers, 30, "alertmanager to answer")
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return proc, api


@pytest.mark.process
def test_real_alertmanager_delivers_by_route_and_inhibits_gpu_alerts(
    tmp_path: Path, receiver: Receiver
) -> None:
    path = _config(tmp_path, receiver)
    proc, api = _start_alertmanager(tmp_path, path)
    try:
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


def _as_prometheus(name: str, labels: dict[str, str], annotations: dict[str, str]) -> Any:
    """An alert as Prometheus posts it: the rule's labels and rendered annotations, startsAt,
    and an endsAt that Prometheus pushes forward while the alert fires."""
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, **labels},
        "annotations": annotations,
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
        "generatorURL": "http://prometheus:9090/graph",
    }


@pytest.mark.process
def test_the_specific_gpu_alert_pages_and_holds_back_the_generic_ones(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Issue 29: GPU 3 of node-a fell off the bus, so its verdict fails too, and so does the
    node's; GPU 5 fails on its own. The pager gets GpufleetGpuLost for GPU 3 and
    GpufleetGpuFailed for GPU 5 only; GPU 3's GpufleetGpuFailed and the node's
    GpufleetNodeFailed are held back. Without the inhibition (the config reloaded without
    it) the held-back ones are delivered: they were held back by it, not lost."""
    from gpufleet.cli import prometheus_rule_tests as R

    path = _config(tmp_path, receiver)
    host, instance = R.HOST, R.INSTANCE
    gpu3 = {"instance": instance, "Hostname": host, "gpu": "3", "UUID": R.UUID}
    gpu5 = {**gpu3, "gpu": "5", "UUID": R.UUID.replace("8c1f", "5555")}
    crit = {"severity": "critical", "scope": "gpu"}
    # the annotations Prometheus renders for these series (the promtool cases prove them)
    alerts = [
        _as_prometheus("GpufleetGpuLost", {**gpu3, **crit}, R.gpu_lost_text()),
        _as_prometheus(
            "GpufleetGpuFailed",
            {**gpu3, **crit},
            R.gpu_failed_text(evidence=" GPU_LOST: it fell off the bus."),
        ),
        _as_prometheus(
            "GpufleetGpuFailed",
            {**gpu5, **crit},
            R.gpu_failed_text(
                "5", " XID_48: 1 XID 48 event(s) counted by the agent.", uuid=gpu5["UUID"]
            ),
        ),
        _as_prometheus(
            "GpufleetNodeFailed",
            {"instance": instance, "Hostname": host, "severity": "critical", "scope": "node"},
            {"summary": f"node {host} failed its health checks", "description": "..."},
        ),
    ]
    proc, api = _start_alertmanager(tmp_path, path)
    try:
        httpx.post(f"{api}/alerts", json=alerts, timeout=5).raise_for_status()
        # GPU 5's GpufleetGpuFailed is in the same group as GPU 3's (alertname, instance):
        # the notification that carries it shows what the group held back
        gpu_lost = ("GpufleetGpuLost", f"3@{instance}")
        failed3, failed5 = (
            ("GpufleetGpuFailed", f"3@{instance}"),
            ("GpufleetGpuFailed", f"5@{instance}"),
        )
        node_failed = ("GpufleetNodeFailed", f"-@{instance}")
        wait_truthy(lambda: {gpu_lost, failed5} <= receiver.alerts("/pager"), 15, "the pages")
        assert receiver.alerts("/pager") == {gpu_lost, failed5}, receiver.got
        assert receiver.alerts("/ops") == set(), receiver.got
        listed = httpx.get(f"{api}/alerts", timeout=5).json()
        state = {
            (a["labels"]["alertname"], a["labels"].get("gpu", "-")): a["status"] for a in listed
        }
        fingerprint = {
            (a["labels"]["alertname"], a["labels"].get("gpu", "-")): a["fingerprint"]
            for a in listed
        }
        assert state[("GpufleetGpuFailed", "3")]["state"] == "suppressed"
        assert state[("GpufleetGpuFailed", "3")]["inhibitedBy"] == [
            fingerprint[("GpufleetGpuLost", "3")]
        ]
        assert state[("GpufleetNodeFailed", "-")]["state"] == "suppressed"
        assert state[("GpufleetGpuLost", "3")] == {
            "state": "active",
            "inhibitedBy": [],
            "silencedBy": [],
        }
        assert state[("GpufleetGpuFailed", "5")]["state"] == "active"
        # the page's words name the node, the GPU and the finding code
        delivered = receiver.firing("/pager")
        lost_text = delivered[gpu_lost]["description"]
        assert f"GPU 3 ({R.UUID}) on {host}" in lost_text and "GPU_LOST" in lost_text
        assert "GPU 5" in delivered[failed5]["description"]
        assert "XID_48" in delivered[failed5]["description"]

        # counter-check: the same alerts without the inhibit rules page all four
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc.pop("inhibit_rules")
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        reload = httpx.post(f"http://{api.split('/')[2]}/-/reload", timeout=10)
        assert reload.status_code == 200, reload.text
        wait_truthy(
            lambda: {failed3, node_failed} <= receiver.alerts("/pager"),
            15,
            "the alerts held back before, once the inhibition is gone",
        )
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
    assert doc["inhibit_rules"][0]["equal"] == ["instance", "gpu"]
