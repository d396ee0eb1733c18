"""The agent process's endpoints and its health integration, on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.server import AgentServer, parse_listen
from gpufleet.devices.sim import Fault, FaultKind, ManualClock
from gpufleet.errors import UsageError
from tests.agent.conftest import sim_node


@pytest.fixture
def served() -> Iterator[tuple[Agent, str, ManualClock]]:
    clock = ManualClock()
    fleet, node = sim_node("1x4xh100", clock)
    fleet.inject(Fault(FaultKind.ECC_DBE, gpu=2, at_s=2.5, params={"count": 1}))
    agent = Agent(node.backend(), AgentConfig(), clock=clock)
    server = AgentServer(agent, "127.0.0.1", 0).start()
    yield agent, f"http://127.0.0.1:{server.port}", clock
    server.stop()
    agent.close()


@pytest.mark.process
def test_endpoints_and_health(served: tuple[Agent, str, ManualClock]) -> None:
    agent, url, clock = served
    with httpx.Client(timeout=5) as c:
        assert c.get(f"{url}/healthz").status_code == 503  # no sampling round yet
        for _ in range(5):
            agent.tick()
            clock.advance(1)
        assert c.get(f"{url}/healthz").json()["ok"] is True
        health = c.get(f"{url}/health").json()
        assert health["verdict_word"] == "fail"  # a double-bit ECC error fails the GPU
        dbe = [f for f in health["findings"] if f["gpu_index"] == 2]
        assert dbe and dbe[0]["severity"] == 2
        assert health["gpus"]["0"] == "ok" and health["gpus"]["2"] == "fail"
        metrics = c.get(f"{url}/metrics")
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        lines = metrics.text.splitlines()
        status = {
            ln.split('gpu="')[1].split('"')[0]: ln.rsplit(" ", 1)[1]
            for ln in lines
            if ln.startswith("gpufleet_gpu_health_status{")
        }
        assert status == {"0": "0", "1": "0", "2": "2", "3": "0"}
        assert 'gpufleet_node_health_status{Hostname="sim-00"} 2' in lines
        assert c.get(f"{url}/nope").status_code == 404


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen("[::1]:9500") == ("::1", 9500)
    with pytest.raises(UsageError, match="HOST:PORT"):
        parse_listen("9400x")


def test_a_failing_evaluator_never_crashes_the_agent() -> None:
    clock = ManualClock()
    _, node = sim_node("1x1xh100", clock)

    def broken(_: object) -> object:
        raise RuntimeError("rule bug")

    agent = Agent(node.backend(), AgentConfig(), clock=clock, evaluator=broken)  # type: ignore[arg-type]
    r = agent.tick()
    assert r is not None and r.sampled == (0,)
    assert agent.health_errors == 1
    assert b"gpufleet_agent_health_errors_total" in agent.render_metrics()
    agent.close()
