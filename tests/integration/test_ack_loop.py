"""The acknowledgement loop end to end: a sticky DBE finding drains a node; the GPU is reset (its
volatile DBE counter back to 0) but the finding stays; an operator acknowledges it on the
control plane; the agent hears of it in its ``Ack``, acknowledges it in its own health tracker
(ack log: who and why), drops it from its snapshot, the controller clears it, and the node goes
back to service and stays there. Once with the real agent (`gpufleet.agent.runner.Agent`), once
with the simulated agents of `gpufleet up` (``NodePusher``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.runner import Agent
from gpufleet.devices.sim import Fault, FaultKind
from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.integration.conftest import RealAgent, fleet_of

pytestmark = pytest.mark.process


DBE = "ECC_DBE_VOLATILE"


def node_doc(ctl: Controller, node: str) -> dict[str, Any]:
    """The node as the API shows it ({} before it registered)."""
    r = ctl.call("GET", f"/api/v1/nodes/{node}")
    doc: dict[str, Any] = r.json()["node"] if r.status_code == 200 else {}
    return doc


def findings(ctl: Controller, node: str, active: bool) -> list[dict[str, Any]]:
    r = ctl.call("GET", "/api/v1/findings", params={"node": node, "active": active})
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()
    return out


def in_state(ctl: Controller, node: str, *states: str) -> str | None:
    d = node_doc(ctl, node)
    return str(d["state_reason"]) if d.get("state") in states else None


def health_metrics(agent: Agent) -> list[float]:
    """The agent's gpufleet_gpu_health_status (GPUs in order) then gpufleet_node_health_status
    (0 ok, 1 warn, 2 fail, 3 unknown)."""
    lines = agent.render_metrics().decode().splitlines()
    out = []
    for name in ("gpufleet_gpu_health_status{", "gpufleet_node_health_status{"):
        out += [float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(name)]
    return out


def resume_and_stay(ctl: Controller, node: str) -> None:
    """Resume the node; it is in service, and still is after several more pushes."""
    r = ctl.call("POST", f"/api/v1/nodes/{node}/actions/resume", json={"reason": "DBE handled"})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "in_service"
    time.sleep(2.0)  # 5+ pushes at 0.3-0.4 s: nothing drains it again
    d = node_doc(ctl, node)
    assert d["state"] == "in_service", d
    assert [f for f in findings(ctl, node, True) if f["severity"] >= 2] == []


def test_real_agent_drops_a_finding_acknowledged_on_the_control_plane(
    tmp_path: Path, real_agent: RealAgent
) -> None:
    ctl, fleet, node, agent = real_agent.ctl, real_agent.fleet, real_agent.node, real_agent.agent
    wait_for(lambda: in_state(ctl, "sim-00", "in_service"), 15, "sim-00 in service")

    fleet.inject(Fault(FaultKind.ECC_DBE, node="sim-00", gpu=2))
    reason = wait_for(lambda: in_state(ctl, "sim-00", "draining", "drained"), 15, "sim-00 drained")
    assert DBE in reason or "XID_48" in reason
    wait_for(lambda: DBE in {f["code"] for f in findings(ctl, "sim-00", True)}, 10, "DBE stored")

    node.gpus[2].ecc_dbe_volatile = 0  # a GPU reset clears the volatile counter
    time.sleep(1.0)  # 5 evaluations, 3 pushes: sticky, so it stays everywhere
    assert DBE in {f["code"] for f in agent.health_doc()["findings"]}
    assert health_metrics(agent) == [0.0, 0.0, 2.0, 0.0, 2.0]  # GPU 2 and the node: fail
    sticky = [f for f in findings(ctl, "sim-00", True) if f["sticky"]]
    assert DBE in {f["code"] for f in sticky}

    for f in sticky:  # what the dashboard's Acknowledge button does, once per finding
        r = ctl.call("POST", f"/api/v1/findings/{f['id']}/acknowledge")
        assert r.status_code == 200 and r.json()["acknowledged_by"] == "admin:testbed"

    def agent_ok() -> bool:
        doc = agent.health_doc()
        return bool(doc["verdict_word"] == "ok" and doc["findings"] == [])

    wait_for(agent_ok, 5, "the agent's /health ok, without the acknowledged findings")
    assert health_metrics(agent) == [0.0] * 5  # 4 GPUs and the node: ok
    ids = {f["id"] for f in sticky}

    def cleared() -> bool:
        done = {f["id"]: f for f in findings(ctl, "sim-00", False) if f["id"] in ids}
        return len(done) == len(ids) and all(f["cleared_s"] for f in done.values())

    wait_for(cleared, 5, "the controller cleared the acknowledged findings")

    log = [
        json.loads(x) for x in (tmp_path / "agent" / "health-acks.jsonl").read_text().splitlines()
    ]
    assert {(a["code"], a["who"], a["why"]) for a in log} == {
        (f["code"], "admin:testbed", "acknowledged on the control plane by admin:testbed")
        for f in sticky
    }
    assert agent.acks_applied == len(sticky)
    resume_and_stay(ctl, "sim-00")
    assert agent.health_doc()["verdict_word"] == "ok"


def test_simulated_agents_drop_a_finding_acknowledged_on_the_control_plane(
    tmp_path: Path,
) -> None:
    ctl = Controller(tmp_path / "data", scheduler="none").start()
    agents: Agents | None = None
    try:
        agents = Agents(ctl.url, ctl.token("agent"), fleet_of(["n1"]), run_jobs=False).start()
        wait_for(lambda: in_state(ctl, "n1", "in_service"), 15, "n1 in service")
        agent = agents.agents[0]  # the real agent of n1
        fleet = agents.fleet
        gpu = fleet.node("n1").gpus[1]
        fleet.inject(Fault(FaultKind.ECC_DBE, node="n1", gpu=1, at_s=fleet.clock() - gpu.t0))
        wait_for(lambda: in_state(ctl, "n1", "draining", "drained"), 15, "n1 drained")
        wait_for(lambda: DBE in {f["code"] for f in findings(ctl, "n1", True)}, 10, "DBE stored")

        gpu.ecc_dbe_volatile = 0  # a GPU reset clears the volatile counter
        time.sleep(1.0)
        assert DBE in {f.code for f in agent.health.findings}  # sticky: still reported
        sticky = [f for f in findings(ctl, "n1", True) if f["sticky"]]
        assert DBE in {f["code"] for f in sticky}

        why = "GPU reset; DBE counter back to 0"
        r = ctl.call("POST", "/api/v1/nodes/n1/actions/acknowledge", json={"reason": why})
        assert r.status_code == 200, r.text

        wait_for(lambda: not agent.health.findings, 5, "the agent dropped its findings")
        ids = {f["id"] for f in sticky}

        def cleared() -> bool:
            done = [f for f in findings(ctl, "n1", False) if f["id"] in ids]
            return len(done) == len(ids) and all(f["cleared_s"] for f in done)

        wait_for(cleared, 5, "the controller cleared the acknowledged findings")
        acks = agent.evaluate.tracker.acknowledgements()
        assert {(a.code, a.who, a.why) for a in acks} == {
            (f["code"], "admin:testbed", why) for f in sticky
        }
        resume_and_stay(ctl, "n1")
        assert not agent.health.findings
    finally:
        if agents is not None:
            agents.stop()
        ctl.stop()
