"""Every way a simulated update fails, in one campaign over real processes (issue 15): the
update command is the simulator's update (`gpufleet.devices.sim.update`), each node but one
carries an update fault. Each failed node ends in repair with its reason, the healthy node is
updated and back in service, and the campaign halts at max_failures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.testbed import wait_for
from tests.integration import campaigns
from tests.integration.campaigns import NEW, SupervisedAgent

pytestmark = pytest.mark.process


FAULTS = {  # node -> (its update fault, what its failure reason says)
    "fu-noret": ("update_no_return", "no outcome reported for the update"),
    "fu-old": ("update_old_version", "versions not at baseline after the update: gpu0 driver"),
    "fu-val": ("update_fails_validation", "validation after the update failed"),
    "fu-gpu": ("update_gpu_lost", "fell off the bus after the update"),
}


def test_each_update_failure_ends_in_repair_with_its_reason(tmp_path: Path) -> None:
    nodes = [*FAULTS, "fu-ok"]
    ctl, tokens = campaigns.controller(tmp_path, nodes)
    agents = [
        SupervisedAgent(
            n,
            ctl.url,
            tokens[n],
            tmp_path / n,
            [{"kind": FAULTS[n][0], "gpu": 0}] if n in FAULTS else None,
        )
        for n in nodes
    ]
    try:
        for n in nodes:
            ctl.wait_in_service(n, 120)
        command = (
            f"{sys.executable} -m gpufleet.devices.sim.update --fleet ../fleet.yaml "
            f"--driver {NEW} --after 1"
        )
        body = campaigns.body(
            command,
            batch=len(nodes),
            floor=0.0,
            max_failures=len(FAULTS),
            update_timeout_s=20,
            back_timeout_s=20,
            verify_timeout_s=20,
            validate_timeout_s=60,
        )
        cid = campaigns.start(ctl, body)["id"]

        def settled() -> dict[str, Any] | None:
            doc = campaigns.status(ctl, cid)
            final = all(n["step"] in ("done", "failed", "skipped") for n in doc["nodes"])
            return doc if final and doc["state"] != "running" else None

        doc = wait_for(settled, 200, "campaign settled", step_s=0.5)
        assert doc["state"] == "halted", doc
        assert doc["failures"] == len(FAULTS)
        steps = {n["node"]: n for n in doc["nodes"]}
        assert steps["fu-ok"]["step"] == "done"
        assert ctl.node_state("fu-ok") == "in_service"
        for node, (_kind, reason) in FAULTS.items():
            assert steps[node]["step"] == "failed", steps[node]
            assert reason in steps[node]["reason"], steps[node]
            assert ctl.node_state(node) == "repair"
    finally:
        for a in agents:
            a.stop()
        ctl.stop()
