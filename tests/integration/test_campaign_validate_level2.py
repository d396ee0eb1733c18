"""``--validate-level 2`` in a campaign (issue 15) over real processes: after its update each
node's agent is asked (``validate_level`` in its ``Ack``) to run ``gpufleet validate --level 2``
on its node, as a child process, and posts that report. A node whose memory test finds bad
addresses (a fault only level 2 sees: the agent's own level-1 gate passes it) goes to repair
with the failing check as the reason; the healthy node is done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.testbed import wait_for
from tests.integration.test_campaign_processes import NEW, OLD, SCRIPT, SupervisedAgent

pytestmark = pytest.mark.process


NODES = ["lv0", "lv1"]


def test_level_2_after_the_update_catches_what_level_1_does_not(tmp_path: Path) -> None:
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None), **{n: ("agent", n) for n in NODES}})
    ctl = ControllerProcess(data, tokens["admin"]).start()
    log = tmp_path / "updates.log"
    script = tmp_path / "site-update.sh"
    script.write_text(SCRIPT.format(log=log, old=OLD, new=NEW), encoding="utf-8")
    script.chmod(0o700)
    bad = [{"kind": "memory_errors", "gpu": 1, "count": 3}]
    agents = [
        SupervisedAgent("lv0", ctl.url, tokens["lv0"], tmp_path / "lv0"),
        SupervisedAgent("lv1", ctl.url, tokens["lv1"], tmp_path / "lv1", faults=bad),
    ]
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)  # level 1 (the agent's gate) passes both
        body = {
            "baseline": {"models": {"h100-sxm": {"driver": NEW}}},
            "batch": 1,
            "floor": 0.4,
            "max_failures": 2,
            "update_command": str(script),
            "update_timeout_s": 60,
            "back_timeout_s": 60,
            "verify_timeout_s": 30,
            "validate_timeout_s": 120,
            "validate_level": 2,
        }
        r = ctl.call("POST", "/api/v1/maintenance/campaigns", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]

        def status() -> dict[str, Any]:
            doc: dict[str, Any] = ctl.call("GET", f"/api/v1/maintenance/campaigns/{cid}").json()
            return doc

        wait_for(lambda: status()["state"] != "running", 200, "campaign ended", step_s=0.5)
        doc = status()
        steps = {n["node"]: n for n in doc["nodes"]}
        assert steps["lv0"]["step"] == "done", doc
        assert steps["lv1"]["step"] == "failed", doc
        why = steps["lv1"]["reason"]
        assert "validation after the update failed" in why and "level 2" in why, why
        assert "memory" in why, why
        nodes = ctl.call("GET", "/api/v1/nodes").json()
        items = {i["name"]: i for i in (nodes["nodes"] if isinstance(nodes, dict) else nodes)}
        assert items["lv0"]["state"] == "in_service"
        assert items["lv1"]["state"] == "repair"
    finally:
        for a in agents:
            a.stop()
        ctl.stop()
