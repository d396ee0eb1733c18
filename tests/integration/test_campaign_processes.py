"""A maintenance campaign over real processes (issue 15): a controller and three simulated
agents, whose update command is a real script. The script changes the node's driver version in
the fleet file the simulator reads and restarts the agent (as ``systemctl restart`` would: it
kills the agent; a supervisor here starts it again). The controller is killed with SIGKILL
mid-campaign and started again on the same database. In the end every node is at the baseline,
in service and uncordoned, each node's update ran exactly once, and in-service capacity never
went below the floor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled
from tests.integration import campaigns
from tests.integration.campaigns import NEW, SupervisedAgent

pytestmark = pytest.mark.process


NODES = ["cm0", "cm1", "cm2"]


def test_campaign_with_a_real_update_script_and_a_controller_kill(tmp_path: Path) -> None:
    ctl, tokens = campaigns.controller(tmp_path, NODES)
    script, log = campaigns.update_script(tmp_path)
    agents = [SupervisedAgent(n, ctl.url, tokens[n], tmp_path / n) for n in NODES]
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)
        body = campaigns.body(
            str(script),
            batch=2,
            floor=0.3,
            # the step timeouts are what the campaign counts a node failed by, the controller's
            # restart and a loaded machine's slow agent re-exec included: each far above a
            # passing run's (a few seconds), scaled with the tests' time scale
            update_timeout_s=scaled(120),
            back_timeout_s=scaled(120),
            verify_timeout_s=scaled(90),
            validate_timeout_s=scaled(120),
        )
        created = campaigns.start(ctl, body)
        cid = created["id"]
        assert {n["node"] for n in created["nodes"]} == set(NODES)
        dips: list[Any] = []  # what the nodes were when capacity read below the floor

        def status() -> dict[str, Any]:
            doc = campaigns.status(ctl, cid)
            frac = doc["capacity"]["in_service_fraction"]
            if frac is not None and frac < 0.3 - 1e-9:
                nodes = ctl.call("GET", "/api/v1/nodes").json()
                rows = nodes["nodes"] if isinstance(nodes, dict) else nodes
                events = ctl.call("GET", "/api/v1/events", params={"limit": 30}).json()
                dips.append(
                    (
                        {k: v for k, v in doc["capacity"].items() if k != "history"},
                        [(n["node"], n["step"]) for n in doc["nodes"]],
                        [(r.get("name"), r.get("state"), r.get("cordoned")) for r in rows],
                        [(e.get("node"), e.get("message")) for e in events],
                    )
                )
            return doc

        def some_updating() -> bool:
            return any(n["step"] in ("updating", "rebooting") for n in status()["nodes"])

        wait_for(some_updating, 90, "a node in its update")
        ctl.kill9()
        ctl.start()

        def ended() -> bool:
            return bool(status()["state"] != "running")

        wait_for(ended, 300, "campaign ended", step_s=0.5)
        doc = status()
        steps = [(n["node"], n["step"], n.get("reason")) for n in doc["nodes"]]
        assert doc["state"] == "done", f"{doc['reason']}; nodes {steps}\n{_logs(tmp_path)}"
        assert {n["step"] for n in doc["nodes"]} == {"done"}, doc["nodes"]
        runs = log.read_text(encoding="utf-8").split()
        assert sorted(runs[0::2]) == NODES  # each node's update ran exactly once
        nodes = ctl.call("GET", "/api/v1/nodes").json()
        items = nodes["nodes"] if isinstance(nodes, dict) else nodes
        for item in items:
            assert item["state"] == "in_service" and not item["cordoned"], item
        # floor 30 % of 6 GPUs: at most 2 nodes out at once -> never below 1/3
        assert not dips, f"capacity below the floor: {dips}\n{_logs(tmp_path)}"
        for a in agents:
            # the script restarted it (a supervisor start, or the agent's own re-exec when its
            # report of the update went out before it stopped)
            logs = "".join(p.read_text() for p in a.state_dir.glob("agent-*.log"))
            assert logs.count(f"gpufleet agent on {a.node}") >= 2
            fleet = json.loads((a.state_dir / "fleet.yaml").read_text(encoding="utf-8"))
            assert fleet["nodes"][0]["driver_version"] == NEW
    finally:
        for a in agents:
            a.stop()
        ctl.stop()


def _logs(root: Path) -> str:
    """The tail of every process log under ``root``: what a failed run is read from."""
    return "\n".join(
        f"--- {p.relative_to(root)}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
        for p in sorted(root.rglob("*.log"))
    )
