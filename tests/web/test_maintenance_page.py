"""The maintenance campaign page in a real browser (issue 15): a campaign over a simulated
fleet whose in-process agents run the update; its page shows the same step counts as the API,
the failed node with its reason, the capacity chart against the floor, and pause/resume/abort
only to an operator of no tenant: a viewer and a tenant's operator see no button and the API
refuses them the action. The operator presses Pause and the page shows the campaign paused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.conftest import FleetStarter, LiveFleet, artifacts_dir, wait_for

pytestmark = pytest.mark.slow
NODES = 6


@pytest.fixture(scope="module")
def fleet6(live_fleet: FleetStarter) -> LiveFleet:
    f = live_fleet("web-maint", f"{NODES}x2xh100-sxm")
    store = f.service.store
    f.tokens["tenant_op"] = store.tokens.create("operator", name="t-op", tenant="t1")[0]
    return f


def _post(f: LiveFleet, path: str, role: str, body: Any = None) -> httpx.Response:
    return httpx.post(
        f"{f.url}/api/v1{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {f.tokens[role]}"},
        timeout=10,
    )


def _steady_campaign(f: LiveFleet) -> dict[str, Any]:
    """A campaign whose first node fails verification (the update, `true`, changes no
    version) and goes to repair; the circuit breaker (one node out of six) then holds the rest
    selected: the step counts stay still while the browser reads them."""

    def in_service() -> bool:
        nodes = f.api("/nodes?limit=100")["nodes"]
        return bool(sum(n["state"] == "in_service" for n in nodes) == NODES)

    assert wait_for(in_service, 90), "the simulated nodes did not reach in_service"
    body = {
        "baseline": {"models": {"h100-sxm": {"driver": "999.1.1"}}},  # every node is older
        "batch": 1,
        "floor": 0.5,
        "max_failures": 5,
        "update_command": "true",
        "verify_timeout_s": 2,
    }
    r = _post(f, "/maintenance/campaigns", "operator", body)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]

    def settled() -> bool:
        doc = f.api(f"/maintenance/campaigns/{cid}")
        return bool(doc["by_step"] == {"selected": NODES - 1, "failed": 1})

    assert wait_for(settled, 90), f.api(f"/maintenance/campaigns/{cid}")
    doc: dict[str, Any] = f.api(f"/maintenance/campaigns/{cid}")
    return doc


def _open(page: Any, f: LiveFleet, role: str, route: str) -> None:
    """A fresh load (a fragment-only change would not reload the page with the new token)."""
    page.goto("about:blank")
    page.goto(f.dashboard(role, route))


def _counts(page: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for el in page.query_selector_all("#mc-steps [data-step-count]"):
        out[el.get_attribute("data-step-count")] = int(el.query_selector("b").inner_text())
    return out


def test_campaign_page_counts_chart_failures_and_buttons(fleet6: LiveFleet, page: Any) -> None:
    doc = _steady_campaign(fleet6)
    cid = doc["id"]
    # a viewer: the page, no buttons; the API refuses the action
    _open(page, fleet6, "viewer", f"/maintenance/{cid}")
    page.wait_for_selector("#mc-steps [data-step-count]")
    assert _counts(page) == doc["by_step"]
    assert page.query_selector_all("#mc-buttons button") == []
    assert _post(fleet6, f"/maintenance/campaigns/{cid}/pause", "viewer").status_code == 403
    # the failed node and its reason, the chart with its floor line
    failed = [n for n in doc["nodes"] if n["step"] == "failed"]
    item = page.wait_for_selector(f"#mc-failures li[data-node='{failed[0]['node']}']")
    assert "versions not at baseline" in item.inner_text()
    chart = page.query_selector("#mc-chart")
    assert int(chart.get_attribute("data-points")) == len(doc["capacity"]["history"])
    assert "floor 50 %" in chart.inner_text()
    assert len(page.query_selector_all("#mc-nodes tbody tr")) == NODES
    # the list page links the campaign with the same counts
    page.click("#nav a[data-view='maintenance']")
    row = page.wait_for_selector(f"#mc-list tr[data-campaign='{cid}']")
    assert "5 selected" in row.inner_text() and "1 failed" in row.inner_text()

    # a tenant's operator: no buttons either, and refused by the API
    _open(page, fleet6, "tenant_op", f"/maintenance/{cid}")
    page.wait_for_selector("#mc-state")
    assert page.query_selector_all("#mc-buttons button") == []
    assert _post(fleet6, f"/maintenance/campaigns/{cid}/pause", "tenant_op").status_code == 403
    # its campaign list counts the steps of the nodes its campaign status shows it
    t_hdr = {"Authorization": f"Bearer {fleet6.tokens['tenant_op']}"}
    t_one = httpx.get(f"{fleet6.url}/api/v1/maintenance/campaigns/{cid}", headers=t_hdr).json()
    t_rows = httpx.get(f"{fleet6.url}/api/v1/maintenance/campaigns", headers=t_hdr).json()
    t_row = next(r for r in t_rows if r["id"] == cid)
    assert t_row["by_step"] == t_one["by_step"] and t_row["nodes"] == len(t_one["nodes"])
    assert t_one["capacity"] is None  # a tenant does not read the fleet's capacity

    # an operator: Pause, the page shows it paused, the API agrees; then Resume comes back
    _open(page, fleet6, "operator", f"/maintenance/{cid}")
    page.wait_for_selector("#mc-pause")
    assert page.query_selector("#mc-resume") is None
    page.click("#mc-pause")
    page.wait_for_selector("#mc-state[data-state='paused']")
    page.wait_for_selector("#mc-resume")
    assert fleet6.api(f"/maintenance/campaigns/{cid}")["state"] == "paused"
    page.screenshot(path=str(Path(artifacts_dir()) / "maintenance-campaign.png"), full_page=True)
    page.click("#mc-abort")
    page.click("#dlg-ok")
    page.wait_for_selector("#mc-state[data-state='aborted']")
    assert fleet6.api(f"/maintenance/campaigns/{cid}")["state"] == "aborted"
    assert page.query_selector_all("#mc-buttons button") == []


def test_policy_proposal_is_shown_and_started_from_the_page(fleet6: LiveFleet, page: Any) -> None:
    """The recurring policy's next occurrence on the list page, its proposal with a Start
    button; an operator starts it (runs after the first test, whose campaign it aborted)."""
    pol = fleet6.api("/policy")
    pol["maintenance"] = {  # weekly, proposed up to 8 days ahead: due now
        "every": "weekly",
        "on": "Saturday",
        "window": "02:00-06:00 Europe/Berlin",
        "baseline": {"models": {"h100-sxm": {"driver": "999.1.1"}}},
        "update_command": "true",
        "batch": "1",
        "floor": "50%",
        "propose_days_before": 8,
    }
    r = httpx.put(
        f"{fleet6.url}/api/v1/policy",
        json=pol,
        headers={"Authorization": f"Bearer {fleet6.tokens['admin']}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text

    def proposed() -> list[dict[str, Any]]:
        return [c for c in fleet6.api("/maintenance/campaigns") if c["state"] == "proposed"]

    assert wait_for(lambda: bool(proposed()), 30), fleet6.api("/maintenance/campaigns")
    prop = proposed()[0]
    _open(page, fleet6, "operator", "/maintenance")
    start = fleet6.api("/maintenance/policy")["next"]["start"]  # ISO 8601, UTC
    assert page.wait_for_selector("#mc-next").inner_text() == start[:19].replace("T", " ")
    row = page.wait_for_selector(f"#mc-list tr[data-campaign='{prop['id']}']")
    assert "proposed" in row.inner_text()
    row.query_selector("a").click()
    page.click("#mc-start")
    page.click("#dlg-ok")
    page.wait_for_selector("#mc-state[data-state='running']")
    assert fleet6.api(f"/maintenance/campaigns/{prop['id']}")["state"] == "running"
