"""Issue 14 item 18 in a real browser: a node the controller declared lost shows its health as
"unknown" with the age of its data, never its last figures as current (overview, nodes table,
node page, fleet counts), and the "needs attention" list gives the reason a node is there (its
worst finding while it is in service, how long a lost node has been silent)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.devices.sim import Fault, FaultKind
from tests.web.conftest import FleetStarter, LiveFleet, artifacts_dir, wait_for

pytestmark = pytest.mark.slow

GHOST = "ghost-01"
WARN_NODE = "sim-02"


@pytest.fixture(scope="module")
def fleet4(live_fleet: FleetStarter) -> LiveFleet:
    return live_fleet("web-lost", "4x2xh100-sxm")


def _ghost_batch(seq: int) -> dict[str, Any]:
    """A node whose last report says: healthy, 77 % busy, 612 W."""
    now = time.time()
    body: dict[str, Any] = {
        "schema_version": 1,
        "node": GHOST,
        "agent_id": "agent-ghost",
        "seq": seq,
        "sent_at_s": now,
        "heartbeat_interval_s": 1.0,
        "health": 0,
        "samples": [
            {
                "gpu_uuid": f"GPU-ghost-{g}",
                "gpu_index": g,
                "t": [now],
                "fields": {"gpu_util_pct": [77.0], "power_w": [612.0]},
            }
            for g in range(2)
        ],
        "findings": [],
    }
    if seq == 1:
        body["devices"] = [
            {"index": g, "uuid": f"GPU-ghost-{g}", "info": {"model": "h100-sxm"}} for g in range(2)
        ]
    return body


def _lose_a_node(fleet: LiveFleet) -> None:
    """A node that reported healthy and busy, was validated into service, then fell silent
    until the controller declared it lost."""
    store = fleet.service.store
    if GHOST in store.nodes and store.nodes[GHOST].state == "lost":
        return
    auth = {"Authorization": f"Bearer {fleet.tokens['agent']}"}
    with httpx.Client(base_url=f"{fleet.url}/api/v1", timeout=10) as c:
        for seq in (1, 2):
            r = c.post("/ingest", json=_ghost_batch(seq), headers=auth)
            assert r.status_code == 200, r.text
        admin = {"Authorization": f"Bearer {fleet.tokens['admin']}"}
        r = c.post("/validation-results", json={"node": GHOST, "verdict": "pass"}, headers=admin)
        assert r.status_code == 200, r.text
    assert store.nodes[GHOST].state == "in_service"
    assert wait_for(lambda: store.nodes[GHOST].state == "lost", 30)


def test_lost_node_shows_unknown_health_with_its_data_age(fleet4: LiveFleet, page: Any) -> None:
    assert wait_for(lambda: fleet4.api("/summary")["by_state"]["in_service"] == 4, 30)
    _lose_a_node(fleet4)
    s = fleet4.api("/summary")
    assert s["by_health"]["unknown"] == 1 and s["by_health"]["ok"] == 4
    page.goto(fleet4.dashboard("viewer"))
    row = page.wait_for_selector(f"#attention-table tr[data-node='{GHOST}']")
    assert row is not None
    health = row.query_selector("td:nth-child(3)").inner_text()
    assert re.fullmatch(r"unknown data \d+s old", health), health
    assert "ok" not in health
    reason = row.query_selector("td.reason").inner_text()
    assert re.match(r"no data for \d+s: no heartbeat for ", reason), reason
    assert int(page.inner_text("[data-count-health=unknown]")) == 1

    # the nodes table: no figures for it, only how long there has been no data
    page.evaluate("location.hash = '#/nodes'")
    ghost = page.wait_for_selector(f"#nodes-table tr[data-node='{GHOST}']")
    assert ghost is not None
    text = ghost.inner_text()
    figures = re.sub(r"no data for \d+s", "", text)  # its own age may read 77 s one day
    assert "77" not in figures and "1.22 kW" not in figures, text
    assert re.search(r"no data for \d+s", text), text
    assert "unknown" in text
    alive = page.query_selector("#nodes-table tr[data-node='sim-00']")
    assert alive is not None and "no data" not in alive.inner_text()

    # the node page: unknown in its header, every GPU row marked as not current
    page.evaluate(f"location.hash = '#/node/{GHOST}'")
    page.wait_for_selector("#gpu-table")
    head = page.inner_text("#node-head")
    assert re.search(r"unknown\s+data \d+s old", head), head
    rows = page.query_selector_all("#gpu-table tbody tr")
    assert len(rows) == 2
    for r in rows:
        assert "stale" in (r.get_attribute("class") or "")
        assert re.search(r"unknown\s+no data \d+s", r.inner_text()), r.inner_text()
    page.screenshot(path=str(Path(artifacts_dir()) / "dashboard-lost-node.png"))


def test_needs_attention_names_the_finding(fleet4: LiveFleet, page: Any) -> None:
    """A node in service with a warn finding is listed with that finding as its reason, not
    its lifecycle reason ("validation result: pass ...")."""
    store = fleet4.service.store
    assert wait_for(lambda: store.nodes[WARN_NODE].state == "in_service", 30)
    fleet4.sim.inject(Fault(FaultKind.PERSISTENCE_OFF, node=WARN_NODE, gpu=1))
    assert wait_for(lambda: store.nodes[WARN_NODE].health == 1, 60)
    assert store.nodes[WARN_NODE].state == "in_service"
    page.goto(fleet4.dashboard("viewer"))
    row = page.wait_for_selector(f"#attention-table tr[data-node='{WARN_NODE}']")
    assert row is not None
    reason = row.query_selector("td.reason").inner_text()
    assert reason.startswith("PERSISTENCE_MODE_OFF: GPU 1: persistence mode is off"), reason
    assert "validation result" not in reason
