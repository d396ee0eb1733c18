"""A real Prometheus on loopback scrapes an agent serving a simulated 8-GPU node; the values
queried through Prometheus' HTTP API match what the simulator was told to produce."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.server import AgentServer
from gpufleet.devices.sim import Fault, FaultKind, Load
from tests.agent.conftest import need_binary, sim_node

pytestmark = [pytest.mark.slow, pytest.mark.process]

UTILS = {0: 1.0, 1: 0.5, 2: 0.25, 3: 0.75}  # GPUs 4-7 idle
# mean over 8 GPUs, in %: (100 + 50 + 25 + 75 + 0 * 4) / 8
EXPECTED_AVG_UTIL = 31.25
XIDS = [(5, 13), (5, 13), (6, 48)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def agent_url() -> Iterator[str]:
    fleet, node = sim_node("1x8xh100")
    for idx, util in UTILS.items():
        node.gpus[idx].run(Load(util=util))
    for i, (gpu, xid) in enumerate(XIDS):
        fleet.inject(Fault(FaultKind.XID, gpu=gpu, at_s=0.1 * i, params={"xid": xid}))
    agent = Agent(node.backend(), AgentConfig(fast_interval_s=0.5))
    server = AgentServer(agent, "127.0.0.1", 0).start()
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    loop.start()
    yield f"127.0.0.1:{server.port}"
    stop.set()
    loop.join(timeout=5)
    server.stop()
    agent.close()


def _query(client: httpx.Client, base: str, q: str) -> list[dict[str, object]]:
    r = client.get(f"{base}/api/v1/query", params={"query": q})
    r.raise_for_status()
    doc = r.json()
    assert doc["status"] == "success"
    return list(doc["data"]["result"])


def test_prometheus_scrapes_agent(agent_url: str, tmp_path: Path) -> None:
    prometheus = need_binary("prometheus")
    port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpufleet-agent\n"
        f"    static_configs: [{{targets: ['{agent_url}']}}]\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=5) as client:
            avg: list[dict[str, object]] = []
            xids: list[dict[str, object]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    avg = _query(client, base, "avg(DCGM_FI_DEV_GPU_UTIL)")
                    xids = _query(client, base, "sum by (gpu, xid) (gpufleet_xid_errors_total)")
                except httpx.HTTPError:
                    avg, xids = [], []
                if avg and len(xids) == 2:
                    break
                time.sleep(0.5)
            assert avg, "Prometheus never returned avg(DCGM_FI_DEV_GPU_UTIL)"
            assert float(avg[0]["value"][1]) == pytest.approx(EXPECTED_AVG_UTIL)  # type: ignore[index]
            got = {
                (m["metric"]["gpu"], m["metric"]["xid"]): float(m["value"][1])  # type: ignore[index]
                for m in xids
            }
            assert got == {("5", "13"): 2.0, ("6", "48"): 1.0}
            up = _query(client, base, 'up{job="gpufleet-agent"}')
            assert float(up[0]["value"][1]) == 1.0  # type: ignore[index]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
