"""The real node agent (`gpufleet.agent.runner.Agent`: sampler, health tracker, spooling pusher)
against the real controller on loopback: registration, samples, a fail finding that drains."""

from __future__ import annotations

import pytest

from gpufleet.devices.sim import Fault, FaultKind, Load
from gpufleet.testing.testbed import wait_for
from tests.integration.conftest import RealAgent

pytestmark = pytest.mark.process


def test_real_agent_registers_pushes_and_a_dbe_drains(real_agent: RealAgent) -> None:
    ctl, fleet, node = real_agent.ctl, real_agent.fleet, real_agent.node

    def registered() -> dict[str, object] | None:
        r = ctl.call("GET", "/api/v1/nodes/sim-00")
        if r.status_code != 200:
            return None
        doc: dict[str, object] = r.json()
        node_doc = doc["node"]
        assert isinstance(node_doc, dict)
        return doc if node_doc.get("state") == "in_service" else None

    # in service on its own: the agent ran validation level 1 and posted it (issue 14)
    doc = wait_for(registered, 15, "sim-00 in service")
    devices = doc["devices"]
    assert isinstance(devices, list) and len(devices) == 4
    node_doc = doc["node"]
    assert isinstance(node_doc, dict)
    assert node_doc["state_reason"].startswith("validation result: pass (level 1 by the agent")
    node.gpus[1].run(Load(util=0.5))  # work arrives once the node is in service

    def util_seen() -> bool:
        r = ctl.call("GET", "/api/v1/nodes/sim-00/gpus/1/series?resolution=raw")
        series = r.json() if r.status_code == 200 else {}
        values = [v for v in (series.get("fields", {}).get("gpu_util_pct") or []) if v]
        return bool(values) and max(values) == 50.0  # Load(util=0.5) -> 50 %

    wait_for(util_seen, 15, "GPU 1 utilization 50 % in the controller's series")

    fleet.inject(Fault(FaultKind.ECC_DBE, node="sim-00", gpu=2))

    def drained() -> str | None:
        d = ctl.call("GET", "/api/v1/nodes/sim-00").json()["node"]
        return d["state_reason"] if d.get("state") in ("draining", "drained") else None

    reason = wait_for(drained, 15, "sim-00 drained for the DBE finding")
    assert "ECC_DBE_VOLATILE" in reason or "XID_48" in reason
