"""Long-term metrics in Prometheus, end to end with the real binaries: a real agent (simulated
GPUs) pushes to a real `gpufleet controller` process and serves /metrics; the real Prometheus
finds the agent through the controller (HTTP SD, and a file written by `gpufleet config
prometheus --sd file`) and scrapes it; a controller started with ``--prometheus-url`` then
answers the series API in the same shape as one reading its memory, including samples taken
before it started, and keeps them across its own restart."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.server import AgentServer
from gpufleet.devices.sim import Load, SimFleet, parse_fleet_spec
from gpufleet.testing.testbed import free_port, wait_for
from tests.agent.conftest import need_binary
from tests.integration.processes import cli, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.process]

NODE = "sim-00"
UTIL = {0: 1.0, 1: 0.5}  # Load(util=...) -> 100 % and 50 % in NVML's utilization


def _api(url: str, token: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{url}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def _series(url: str, token: str, gpu: int, **params: Any) -> dict[str, Any] | None:
    r = _api(url, token, f"/nodes/{NODE}/gpus/{gpu}/series", **params)
    if r.status_code != 200:
        return None
    doc: dict[str, Any] = r.json()
    return doc


def _prom(base: str, path: str, **params: str) -> Any:
    r = httpx.get(f"{base}{path}", params=params, timeout=5)
    r.raise_for_status()
    return r.json()["data"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def agent(tmp_path: Path, home: Path) -> Iterator[tuple[Agent, int, str, str]]:
    """The agent of a simulated node, pushing to a controller port (chosen here, not yet
    listening) and serving /metrics; yields it, its metrics port, the controller port as a
    URL and the data directory's admin token."""
    data = tmp_path / "data"
    admin = cli(["token", "create", "--role", "admin", "--data-dir", str(data)], home)["token"]
    agent_token = cli(["token", "create", "--node", NODE, "--data-dir", str(data)], home)["token"]
    fleet = SimFleet(parse_fleet_spec("1x2xh100"))
    node = fleet.node(NODE)
    for gpu, util in UTIL.items():
        node.gpus[gpu].run(Load(util=util))
    url = f"http://127.0.0.1:{free_port()}"
    cfg = AgentConfig(
        fast_interval_s=0.5,
        push_interval_s=0.5,
        controller=url,
        token=agent_token,
        state_dir=tmp_path / "agent",
    )
    ag = Agent(node.backend(), cfg)
    server = AgentServer(ag, "127.0.0.1", 0).start()
    halt = threading.Event()
    loop = threading.Thread(target=ag.run, args=(halt,), daemon=True)
    loop.start()
    try:
        yield ag, server.port, url, admin
    finally:
        halt.set()
        loop.join(timeout=10)
        server.stop()
        ag.close()


def _controller(
    url: str, data: Path, home: Path, prometheus: str | None = None
) -> subprocess.Popen[str]:
    port = url.rsplit(":", 1)[1]
    args = ["controller", "--data-dir", str(data), "--port", port, "--scheduler", "none"]
    if prometheus:
        args += ["--prometheus-url", prometheus]
    proc, ready = start([*args, "--json"], home)
    assert ready["url"] == url
    assert ready["series"] == ("prometheus" if prometheus else "memory")
    return proc


def _prometheus(tmp_path: Path, config: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str]:
    binary = need_binary("prometheus")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, f"http://127.0.0.1:{port}"


def test_prometheus_discovers_agents_and_serves_the_series_api(
    agent: tuple[Agent, int, str, str], tmp_path: Path, home: Path
) -> None:
    _ag, metrics_port, url, admin = agent
    data = tmp_path / "data"
    ctl = _controller(url, data, home)
    prom: subprocess.Popen[bytes] | None = None
    try:
        # the node registers by pushing; its agent listens on loopback, not at NAME:9400
        wait_for(lambda: _api(url, admin, f"/nodes/{NODE}").status_code == 200, 30, "node")
        address = f"127.0.0.1:{metrics_port}"
        r = httpx.patch(
            f"{url}/api/v1/nodes/{NODE}",
            json={"labels": {"metrics_address": address, "team": "a"}},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        viewer = cli(["token", "create", "--role", "viewer", "--data-dir", str(data)], home)
        token_file = tmp_path / "viewer-token"
        token_file.write_text(viewer["token"] + "\n", encoding="utf-8")
        token_file.chmod(0o600)

        # the HTTP SD route: a token is needed; the answer is Prometheus' target-group format
        assert httpx.get(f"{url}/api/v1/prometheus/sd", timeout=10).status_code == 401
        r = _api(url, viewer["token"], "/prometheus/sd")
        assert r.status_code == 200, r.text
        groups = r.json()
        node_doc = _api(url, admin, f"/nodes/{NODE}").json()["node"]
        assert groups == [
            {
                "targets": [address],
                "labels": {
                    "__meta_gpufleet_node": NODE,
                    "__meta_gpufleet_state": node_doc["state"],
                    "__meta_gpufleet_model": node_doc["model"],
                },
            }
        ], groups

        # one Prometheus: the generated HTTP SD job, plus the generated file SD job
        common = ["config", "prometheus", "--controller", url, "--interval", "1"]
        http_doc = cli(
            [
                *common,
                "--sd-token-file",
                str(token_file),
                "--sd-refresh",
                "1",
                "--rules-out",
                str(tmp_path / "gpufleet-rules.yml"),
            ],
            home,
        )["config"]
        sd_file = tmp_path / "targets.json"
        file_doc = cli(
            [*common, "--sd", "file", "--sd-file", str(sd_file), "--token-file", str(token_file)],
            home,
        )["config"]
        assert json.loads(sd_file.read_text(encoding="utf-8")) == groups
        file_job = file_doc["scrape_configs"][0]
        file_job["job_name"] = "gpufleet-agent-file"
        http_doc["scrape_configs"].append(file_job)
        prom, base = _prometheus(tmp_path, http_doc)

        def scraped_by_both() -> bool:
            assert prom is not None and prom.poll() is None, prom.stderr
            up = _prom(base, "/api/v1/query", query="up")
            jobs = {m["metric"]["job"] for m in up["result"] if m["value"][1] == "1"}
            return jobs == {"gpufleet-agent", "gpufleet-agent-file"}

        wait_for(scraped_by_both, 60, "Prometheus scraping the agent found both ways", 0.5)
        targets = _prom(base, "/api/v1/targets")["activeTargets"]
        assert {t["discoveredLabels"]["__meta_gpufleet_node"] for t in targets} == {NODE}
        assert {t["scrapeUrl"] for t in targets} == {f"http://{address}/metrics"}

        # the in-memory answer, while this controller ingests
        def mem_series() -> dict[str, Any] | None:
            doc = _series(url, admin, 1)
            return doc if doc and len(doc["t"]) >= 4 else None

        mem = wait_for(mem_series, 30, "samples in the controller's memory", 0.2)
        stop(ctl)
        restarted = time.time()
        ctl = _controller(url, data, home, prometheus=base)

        def prom_series() -> dict[str, Any] | None:
            doc = _series(url, admin, 1)
            return doc if doc and len(doc["t"]) >= 4 else None

        got = wait_for(prom_series, 30, "series read from Prometheus", 0.2)
        assert got.keys() == mem.keys()
        assert (mem["source"], got["source"]) == ("memory", "prometheus")  # said in the answer
        assert got["partial"] is False
        assert got["fields"].keys() == mem["fields"].keys()
        assert (got["node"], got["gpu"], got["resolution"]) == (NODE, 1, "raw")
        assert got["power_limit_w"] == mem["power_limit_w"]
        for doc in (mem, got):
            assert all(len(col) == len(doc["t"]) for col in doc["fields"].values())
            assert doc["t"] == sorted(doc["t"])
            util = doc["fields"]["gpu_util_pct"]
            assert {v for v in util if v is not None} == {50.0}  # Load(util=0.5)
        # every scrape carries every fast metric: no gaps (the rings hold slow-tier rows too)
        assert None not in got["fields"]["gpu_util_pct"]
        # samples older than this controller: they come from Prometheus, not its memory
        assert min(got["t"]) < restarted
        # FB used: dcgm-exporter's whole MiB, scaled back to bytes
        mem_mib = {round(v / 2**20) for v in mem["fields"]["mem_used_bytes"] if v is not None}
        got_mib = {v / 2**20 for v in got["fields"]["mem_used_bytes"] if v is not None}
        assert got_mib and got_mib <= mem_mib | {m - 1 for m in mem_mib}
        # the clock-event bitmask, rebuilt from the per-reason series, as the agent sent it
        mem_reasons = {v for v in mem["fields"]["clock_event_reasons"] if v is not None}
        got_reasons = {v for v in got["fields"]["clock_event_reasons"] if v is not None}
        assert got_reasons and got_reasons == mem_reasons
        # PCIe throughput: no agent series, so absent, never 0
        assert set(got["fields"]["pcie_tx_bytes_per_s"]) <= {None}

        minute = _series(url, admin, 0, resolution="minute", fields=["gpu_util_pct", "power_w"])
        assert minute is not None and minute["resolution"] == "minute"
        assert minute["t"] and all(t % 60 == 0 for t in minute["t"])
        assert set(minute["fields"]["gpu_util_pct"]) == {100.0}  # Load(util=1.0), every minute
        assert set(minute["min"]["gpu_util_pct"]) == set(minute["max"]["gpu_util_pct"]) == {100.0}
        assert set(minute["min"].keys()) == {"gpu_util_pct", "power_w"}

        # history survives the controller's restart
        first = min(got["t"])
        stop(ctl)
        ctl = _controller(url, data, home, prometheus=base)
        again = wait_for(lambda: _series(url, admin, 1, since_s=first - 1), 30, "series", 0.2)
        # the oldest samples are still there (two jobs scrape the agent, 1 s apart at most,
        # and either job's samples may answer)
        assert first - 1 <= min(again["t"]) <= first + 1
        assert len(again["t"]) >= len(got["t"]) - 1

        # Prometheus gone: a clear 503 naming it, not a traceback or an empty chart
        prom.terminate()
        prom.wait(timeout=15)
        r = _api(url, admin, f"/nodes/{NODE}/gpus/1/series")
        assert r.status_code == 503
        assert f"Prometheus at {base} did not answer" in r.json()["detail"]
    finally:
        stop(ctl)
        if prom is not None and prom.poll() is None:
            prom.terminate()
            prom.wait(timeout=15)
