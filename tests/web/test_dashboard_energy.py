"""The dashboard's energy view in a real browser (Debian's chromium through Playwright) against
a real controller fed by simulated agents over HTTP: the idle-waste panel shows the idle kWh
that the test sums itself from the stored energy minutes (window energy plus the power
integral's share of uncovered time, idle part), not from the API's answer."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.control.db.models import EnergyMinute
from tests.web.conftest import FleetStarter, LiveFleet, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small(live_fleet: FleetStarter) -> LiveFleet:
    return live_fleet("web-energy", "2x4xh100-sxm")


def _stored(fleet: LiveFleet) -> tuple[float, float]:
    """(all kWh, idle kWh) summed from the rows by the test's own arithmetic."""
    total = idle = 0.0
    with fleet.service.store.sessions() as s:
        for r in s.scalars(select(EnergyMinute)):
            fill = r.power_j * (r.power_s - r.window_s) / r.power_s if r.power_s > r.window_s else 0
            total += r.window_j + fill
            idle += r.idle_j
    return total / 3.6e6, idle / 3.6e6


def test_idle_waste_panel_shows_the_stored_idle_energy(small: LiveFleet, browser: Any) -> None:
    store = small.service.store
    assert wait_for(
        lambda: sum(1 for n in store.nodes.values() if n.state == "in_service") == 2, 60
    )
    # some idle time in service, then a flush; the controller's own tick flushes every 15 s,
    # so the figures are read between flushes and retried when one came in between
    assert wait_for(lambda: small.service.flush_rollups() >= 0 and _stored(small)[1] > 0, 60)
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    try:
        for _ in range(5):
            small.service.flush_rollups()
            before = _stored(small)
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(small.dashboard("viewer", "/energy"))
            page.wait_for_selector("#energy-idle-kwh")
            shown = float(page.inner_text("#energy-idle-kwh"))
            total = float(page.inner_text("#energy-total-kwh"))
            if _stored(small) == before:
                break
            page.close()
        assert not errors, errors
        assert shown == pytest.approx(before[1], rel=1e-3)
        assert total == pytest.approx(before[0], rel=1e-3)
        assert page.inner_text("#energy-idle-cost").strip() == "—"  # no price: no cost
        assert page.locator("#energy-tenants tr[data-tenant]").count() == 1  # no tenants: one
    finally:
        ctx.close()
