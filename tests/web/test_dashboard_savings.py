"""The Energy view's "What power orders saved" panel in a real browser (Debian's chromium through
Playwright) against a real controller served over HTTP (issue 31). Two orders, each on its own
node: order A caps a GPU whose job drew 700 W for the hour before and 560 W for the hour during,
its reported progress falling from 100 to 90 samples a second (posted over HTTP as a job would);
order B caps a GPU no job held, 650 W before and 520 W during for the 40 minutes measured, with
no progress at all. The panel must show each order with the energy saved, the cost saved and
the slowdown the test computes here from those inputs, and "unknown" slowdown for B."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gpufleet.control.api.app import create_app
from gpufleet.control.power import ops
from gpufleet.control.power.spec import PowerOrderSpec
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.wire import WirePowerReport
from gpufleet.wire.power import WireGpuPower
from tests.control.conftest import T0, batch, push, ungated
from tests.control.energy_rows import power_minutes, running_job
from tests.serving import serve_app
from tests.web.conftest import artifacts_dir

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PRICE = 0.10  # USD per kWh, the policy's energy_price_per_kwh
BASE = math.ceil(T0 / 60) * 60 + 3 * 3600  # the minute both limits take effect in
ADMIN = Principal(None, "test", Role.ADMIN)
# order A: n1 GPU 0, held by a job reporting progress
A_BEFORE_W, A_DURING_W, A_MINUTES = 700.0, 560.0, 60
RATE_BEFORE, RATE_DURING = 100.0, 90.0  # samples per second
# order B: n2 GPU 0, no job, no progress; only 40 minutes measured under the order
B_BEFORE_W, B_DURING_W, B_MINUTES = 650.0, 520.0, 40


@dataclass
class Served:
    url: str
    token: str
    a: int
    b: int


def _minutes(svc: ControlService, node: str, start: float, n: int, watts: float) -> None:
    """``n`` whole minutes of GPU 0 of ``node`` from ``start`` at ``watts`` (power samples)."""
    power_minutes(svc, node, start, n, watts)


def _job(svc: ControlService, start: float) -> str:
    """A running job holding GPU 0 of n1 since ``start``."""
    return running_job(svc, start)


def _order(svc: ControlService, node: str, before_w: float, to_w: float) -> int:
    """An order capping GPU 0 of ``node`` to ``to_w``, set by its agent at BASE + 30."""
    oid = ops.create(svc.store, PowerOrderSpec(limit_w=to_w, nodes=[node], gpus=[0]), ADMIN)
    rows = [WireGpuPower(gpu=0, from_w=before_w, to_w=to_w, ok=True)]
    key = ops.order_key(oid, node, "apply")
    assert ops.report(
        svc.store, WirePowerReport(node=node, key=key, gpus=rows, done_s=BASE + 30), ADMIN
    )
    return oid


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Served]:
    _ = browser  # a missing chromium stops the file before a controller starts
    clock = ManualClock(T0)
    policy = ungated(RemediationPolicy(energy_price_per_kwh=PRICE))
    data = tmp_path_factory.mktemp("web-savings") / "data"
    svc = ControlService(ServiceConfig(data_dir=data, policy=policy), clock=clock)
    svc.ingest.start()
    try:
        for i, node in enumerate(("n1", "n2")):
            push(svc, batch(node, 1, gpus=1, t=T0, k=1))
            assert node in svc.store.nodes, i
        svc.flush_rollups()
        _minutes(svc, "n1", BASE - 3600, 60, A_BEFORE_W)
        _minutes(svc, "n1", BASE, 1, 630.0)  # the minute the limit changed: left out
        _minutes(svc, "n1", BASE + 60, A_MINUTES, A_DURING_W)
        _minutes(svc, "n2", BASE - 3600, 60, B_BEFORE_W)
        _minutes(svc, "n2", BASE + 60, B_MINUTES, B_DURING_W)
        job = _job(svc, BASE - 4 * 3600)
        clock.advance(BASE + 20 - clock())
        a = _order(svc, "n1", A_BEFORE_W, A_DURING_W)
        b = _order(svc, "n2", B_BEFORE_W, B_DURING_W)
        clock.advance(BASE + 60 + 3600 + 30 - clock())  # A's 60 whole minutes are past
        token = svc.store.tokens.create("viewer")[0]
        operator = svc.store.tokens.create("operator")[0]
        with contextlib.ExitStack() as stack:
            port = stack.enter_context(serve_app(create_app(svc), access_log=False))
            url = f"http://127.0.0.1:{port}"
            # the job's progress, posted as a training loop would: 100/s before, 90/s during
            done = [0.0, RATE_BEFORE * 2400, RATE_BEFORE * 2400 + 5000]
            done.append(done[-1] + RATE_DURING * 2400)
            for at, d in zip((BASE - 3000, BASE - 600, BASE + 600, BASE + 3000), done, strict=True):
                r = httpx.post(
                    f"{url}/api/v1/energy/progress",
                    json={"job": job, "done": d, "unit": "samples", "at_s": at},
                    headers={"Authorization": f"Bearer {operator}"},
                    timeout=10,
                )
                assert r.status_code == 200 and r.json() == {"accepted": True}, r.text
            yield Served(url, token, a, b)
    finally:
        svc.ingest.stop()
        svc.engine.dispose()


def _cell(row: Any, field: str) -> str:
    return str(row.locator(f"td[data-field={field}]").inner_text()).strip()


def _number(text: str, unit: str) -> float:
    value, got = text.split()
    assert got == unit, text
    return float(value)


def test_savings_panel_shows_each_orders_energy_cost_and_slowdown(
    served: Served, page: Any
) -> None:
    # by hand: (before - during) W x the measured GPU-seconds during, at 0.10 USD/kWh
    a_kwh = (A_BEFORE_W - A_DURING_W) * A_MINUTES * 60 / 3.6e6  # 0.14 kWh
    b_kwh = (B_BEFORE_W - B_DURING_W) * B_MINUTES * 60 / 3.6e6  # 0.0867 kWh
    a_slowdown_pct = 100 * (1 - RATE_DURING / RATE_BEFORE)  # 10 %
    page.goto(f"{served.url}/#token={served.token}&/energy")
    page.wait_for_selector("#energy-orders")
    rows = page.locator("#energy-orders tbody tr")
    assert [rows.nth(i).get_attribute("data-order") for i in range(rows.count())] == [
        str(served.b),
        str(served.a),
    ]  # newest first
    a = page.locator(f"#energy-orders tr[data-order='{served.a}']")
    b = page.locator(f"#energy-orders tr[data-order='{served.b}']")
    for row, oid in ((a, served.a), (b, served.b)):
        cells = row.locator("td")
        assert cells.nth(0).inner_text().strip() == str(oid)
        assert cells.nth(1).inner_text().strip() == "active"
        assert cells.nth(2).inner_text().strip() == "1"  # one GPU compared
    assert a.locator("td").nth(3).inner_text().strip() == f"{A_BEFORE_W:.0f} W"
    assert a.locator("td").nth(4).inner_text().strip() == f"{A_DURING_W:.0f} W"
    assert float(_cell(a, "saved_kwh")) == pytest.approx(a_kwh, rel=1e-3)
    assert _number(_cell(a, "cost_saved"), "USD") == pytest.approx(a_kwh * PRICE, rel=5e-3)
    assert _number(_cell(a, "slowdown"), "%") == pytest.approx(a_slowdown_pct, abs=0.05)
    assert float(_cell(b, "saved_kwh")) == pytest.approx(b_kwh, rel=1e-3)
    assert _number(_cell(b, "cost_saved"), "USD") == pytest.approx(b_kwh * PRICE, rel=5e-3)
    assert _cell(b, "slowdown") == "unknown"  # no progress reported: never 0
    title = b.locator("td[data-field=slowdown]").get_attribute("title")
    assert "reported no progress" in str(title)
    page.screenshot(path=str(artifacts_dir() / "dashboard-energy-savings.png"), full_page=True)
