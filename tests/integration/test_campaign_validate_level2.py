"""``--validate-level 2`` in a campaign (issue 15) over real processes: after its update each
node's agent is asked (``validate_level`` in its ``Ack``) to run ``gpufleet validate --level 2``
on its node, as a child process, and posts that report. A node whose memory test finds bad
addresses (a fault only level 2 sees: the agent's own level-1 gate passes it) goes to repair
with the failing check as the reason; the healthy node is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import campaigns
from tests.integration.campaigns import SupervisedAgent

pytestmark = pytest.mark.process


NODES = ["lv0", "lv1"]


def test_level_2_after_the_update_catches_what_level_1_does_not(tmp_path: Path) -> None:
    ctl, tokens = campaigns.controller(tmp_path, NODES)
    script, _log = campaigns.update_script(tmp_path)
    bad = [{"kind": "memory_errors", "gpu": 1, "count": 3}]
    agents = [
        SupervisedAgent("lv0", ctl.url, tokens["lv0"], tmp_path / "lv0"),
        SupervisedAgent("lv1", ctl.url, tokens["lv1"], tmp_path / "lv1", faults=bad),
    ]
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)  # level 1 (the agent's gate) passes both
        body = campaigns.body(
            str(script),
            batch=1,
            floor=0.4,
            max_failures=2,
            validate_timeout_s=120,
            validate_level=2,
        )
        doc = campaigns.wait_ended(ctl, campaigns.start(ctl, body)["id"], 200)
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
