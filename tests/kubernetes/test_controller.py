"""``gpufleet controller --scheduler kubernetes --kubeconfig FILE`` as a real process: a node
whose agent reports a fail finding is cordoned, its GPU pods evicted and the node tainted on the
(fake) Kubernetes API; an unknown ``--scheduler`` is a one-line usage error, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.schedulers.kubernetes.backend import TAINT_KEY
from gpufleet.testing.testbed import free_port
from tests.cli import plain_env, run_gpufleet
from tests.control.conftest import batch, fail_finding
from tests.waiting import wait_truthy

from .fake_api import FakeApi

pytestmark = pytest.mark.process


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: fake\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n"
        "users:\n- name: u\n  user: {token: not-a-secret}\n"
        "contexts:\n- name: c\n  context: {cluster: fake, user: u}\n"
        "current-context: c\n",
        encoding="utf-8",
    )
    return path


def _wait(what: str, fn: Any, limit_s: float = 120.0) -> Any:  # generous: a loaded machine
    return wait_truthy(fn, limit_s, what, step_s=0.1)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as fake:
        fake.add_node("gpu-1")
        fake.add_node("gpu-2")
        fake.add_pod("ml", "train-0", "gpu-1", gpus=8)
        fake.add_pod("ml", "other", "gpu-2", gpus=8)
        yield fake


def test_fail_finding_drains_the_node_through_kubernetes(api: FakeApi, tmp_path: Path) -> None:
    env = plain_env()
    data = tmp_path / "data"
    created = run_gpufleet(
        "token", "create", "--role", "agent", "--data-dir", str(data), "--json", env=env
    )
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)["token"]
    port = free_port()
    conf = _kubeconfig(tmp_path / "kubeconfig", api.port)
    argv = [sys.executable, "-m", "gpufleet", "controller", "--scheduler", "kubernetes"]
    argv += ["--kubeconfig", str(conf), "--data-dir", str(data), "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api/v1"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:

        def push(body: dict[str, Any]) -> None:
            body["sent_at_s"] = time.time()
            r = httpx.post(f"{url}/ingest", json=body, headers=headers, timeout=10)
            assert r.status_code == 200, r.text

        def up() -> bool:  # any HTTP answer: the controller listens
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code > 0
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return False

        _wait("the controller", up)
        for n in ("gpu-1", "gpu-2"):
            push(batch(n, 1))
        push(batch("gpu-1", 2, devices=False, findings=[fail_finding("gpu-1")], health=2))
        node = _wait(
            "the taint",
            lambda: (
                any(t["key"] == TAINT_KEY for t in api.nodes["gpu-1"]["spec"]["taints"])
                and api.nodes["gpu-1"]
            ),
        )
        assert node["spec"]["unschedulable"] is True
        taint = next(t for t in node["spec"]["taints"] if t["key"] == TAINT_KEY)
        assert "XID_79" in taint["value"] and taint["effect"] == "NoExecute"
        assert ("ml", "train-0") not in api.pods  # evicted through the Eviction API
        assert ("ml", "other") in api.pods and not api.nodes["gpu-2"]["spec"].get("unschedulable")
        evictions = [r["path"] for r in api.requests if r["method"] == "POST"]
        assert evictions == ["/api/v1/namespaces/ml/pods/train-0/eviction"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unknown_scheduler_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_gpufleet(
        "controller", "--scheduler", "pbs", "--data-dir", str(tmp_path / "d"), env=plain_env()
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "--scheduler 'pbs'" in lines[0]
    assert "embedded, slurm, kubernetes, none" in lines[0]
    assert not (tmp_path / "d").exists()  # refused before anything was created
