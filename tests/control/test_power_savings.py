"""What a power order saved (issue 31): a GPU whose job draws 700 W for the hour before an order
and 560 W for the hour after it, with the job's reported progress falling from 100 to 90 units
a second. The figures (hand-computed here from those inputs) appear alike in ``GET
/api/v1/energy`` (the Energy view's source), ``gpufleet energy report`` (text and JSON) and
``gpufleet power status --json``; a GPU no job reports progress for has slowdown unknown (None),
never 0."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.client import Client
from gpufleet.control.api.app import create_app
from gpufleet.control.power import ops
from gpufleet.control.power.spec import PowerOrderSpec
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.web import static_dir
from gpufleet.wire import WirePowerReport
from gpufleet.wire.power import WireGpuPower

from .conftest import T0, batch, push
from .energy_rows import power_minutes, running_job

PRICE = 0.10  # per kWh
BEFORE_W, MIXED_W, DURING_W, EARLIER_W = 700.0, 630.0, 560.0, 900.0
RATE_BEFORE, RATE_DURING = 100.0, 90.0  # the job's units per second
BASE = math.ceil(T0 / 60) * 60 + 3 * 3600  # the minute the limit takes effect in
ADMIN = Principal(None, "test", Role.ADMIN)
runner = CliRunner()


def _minutes(svc: ControlService, node: str, gpu: int, start: float, n: int, watts: float) -> None:
    """``n`` whole minutes from ``start`` at constant ``watts`` (power samples only)."""
    power_minutes(svc, node, start, n, watts, gpu)


def _job(svc: ControlService, gpu: int, start: float) -> str:
    """A running job holding ``gpu`` of n1 since ``start``."""
    return running_job(svc, start, gpu)


def _order(svc: ControlService, clock: ManualClock, gpus: list[int]) -> int:
    """An order capping ``gpus`` of n1 to 560 W, set by the agent at BASE + 30."""
    clock.advance(BASE + 20 - clock())
    oid = ops.create(svc.store, PowerOrderSpec(limit_w=DURING_W, nodes=["n1"], gpus=gpus), ADMIN)
    clock.advance(20)
    rows = [WireGpuPower(gpu=g, from_w=BEFORE_W, to_w=DURING_W, ok=True) for g in gpus]
    key = ops.order_key(oid, "n1", "apply")
    rep = WirePowerReport(node="n1", key=key, gpus=rows, done_s=BASE + 30)
    assert ops.report(svc.store, rep, ADMIN)
    return oid


def _fleet(
    make_service: Callable[..., ControlService], clock: ManualClock, *, with_job: bool
) -> tuple[ControlService, int, str | None]:
    svc = make_service(policy=RemediationPolicy(energy_price_per_kwh=PRICE))
    push(svc, batch("n1", 1, gpus=2, t=T0, k=1))  # the node and its GPUs, hours before
    svc.flush_rollups()
    # 900 W two hours before, outside the one-hour baseline: it must not count
    _minutes(svc, "n1", 0, BASE - 7200, 60, EARLIER_W)
    _minutes(svc, "n1", 0, BASE - 3600, 60, BEFORE_W)
    _minutes(svc, "n1", 0, BASE, 1, MIXED_W)  # the minute the limit changed: left out
    _minutes(svc, "n1", 0, BASE + 60, 60, DURING_W)  # one GPU-hour under the order
    job = _job(svc, 0, BASE - 4 * 3600) if with_job else None
    oid = _order(svc, clock, [0])
    clock.advance(BASE + 60 + 3600 + 30 - clock())  # the order's 60 whole minutes are past
    return svc, oid, job


def _progress(c: TestClient, tok: str, job: str) -> None:
    """Readings 40 minutes apart in each window: 100/s before the order, 90/s during it."""
    readings = [
        (BASE - 3000, 0.0),
        (BASE - 600, RATE_BEFORE * 2400),
        (BASE + 600, RATE_BEFORE * 2400 + 5000),
        (BASE + 3000, RATE_BEFORE * 2400 + 5000 + RATE_DURING * 2400),
    ]
    for t, done in readings:
        body = {"job": job, "done": done, "unit": "samples", "at_s": t}
        r = c.post("/api/v1/energy/progress", json=body, headers=_auth(tok))
        assert r.status_code == 200 and r.json() == {"accepted": True}, r.text


def _auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def _in_process(monkeypatch: pytest.MonkeyPatch, svc: ControlService) -> None:
    """The CLI's client answered by the app in this process (no socket)."""
    tc = TestClient(create_app(svc))

    def forward(request: httpx.Request) -> httpx.Response:
        r = tc.request(
            request.method,
            request.url.raw_path.decode(),
            content=request.content,
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        )
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    def make(controller: str, token: str | None, ca: Any = None) -> Client:
        return Client(controller, token or "", transport=httpx.MockTransport(forward))

    monkeypatch.setattr("gpufleet.cli.remote.client", make)


def test_savings_and_slowdown_from_known_power_and_progress(
    make_service: Callable[..., ControlService],
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc, oid, job = _fleet(make_service, clock, with_job=True)
    assert job is not None
    c = TestClient(create_app(svc))
    tok = svc.store.tokens.create("admin")[0]
    _progress(c, tok, job)
    # by hand: 140 W less for 1 GPU-hour = 0.14 kWh, at 0.10/kWh = 0.014
    saved_kwh = (BEFORE_W - DURING_W) * 3600 / 3.6e6
    assert saved_kwh == pytest.approx(0.14)
    slowdown = 1 - RATE_DURING / RATE_BEFORE  # 10 %
    per_unit_before, per_unit_during = BEFORE_W / RATE_BEFORE, DURING_W / RATE_DURING
    work_during = RATE_DURING * 3600  # units done in the hour under the order
    same_work_kwh = work_during * (per_unit_before - per_unit_during) / 3.6e6  # 0.07 kWh

    def check(sv: dict[str, Any]) -> None:
        assert sv["gpus"] == 1 and sv["basis"] == "job"
        assert sv["baseline_s"] == 3600
        assert sv["before"] == {"from_s": BASE - 3600, "to_s": BASE}
        assert sv["during"] == {"from_s": BASE + 60, "to_s": BASE + 3660}
        assert sv["before_w"] == pytest.approx(BEFORE_W)
        assert sv["during_w"] == pytest.approx(DURING_W)
        assert sv["gpu_hours"] == pytest.approx(1.0)
        assert sv["saved_kwh"] == pytest.approx(saved_kwh)
        assert sv["saved_kwh_per_gpu_hour"] == pytest.approx(0.14)
        assert sv["cost_saved"] == pytest.approx(0.014)
        assert sv["currency"] == "USD"
        assert sv["slowdown"] == pytest.approx(slowdown)
        assert sv["slowdown_gpus"] == 1
        assert sv["energy_per_work_saved"] == pytest.approx(1 - per_unit_during / per_unit_before)
        assert sv["saved_kwh_same_work"] == pytest.approx(same_work_kwh)
        assert sv["cost_saved_same_work"] == pytest.approx(same_work_kwh * PRICE)
        (j,) = sv["jobs"]
        assert (j["job"], j["unit"], j["gpus"]) == (job, "samples", 1)
        assert j["rate_before"] == pytest.approx(RATE_BEFORE)
        assert j["rate_during"] == pytest.approx(RATE_DURING)
        assert j["energy_per_unit_before_j"] == pytest.approx(per_unit_before)
        assert j["energy_per_unit_during_j"] == pytest.approx(per_unit_during)

    # the API the Energy view reads
    rep = c.get("/api/v1/energy", params={"since": "1d"}, headers=_auth(tok)).json()
    (po,) = rep["power_orders"]
    assert (po["order"], po["state"]) == (oid, "active")
    check(po)
    # every field of an order the Energy view shows is one the API sends
    view = (static_dir() / "js" / "energy.js").read_text()
    shown = set(re.findall(r"\bo\.([a-z_]+)", view))
    assert {"saved_kwh", "cost_saved", "slowdown", "before_w", "during_w"} <= shown
    assert shown <= set(po), shown - set(po)
    # the order's own status (what `power status` prints)
    check(c.get(f"/api/v1/power/orders/{oid}", headers=_auth(tok)).json()["savings"])
    # the CLI: power status --json, energy report --json and its text
    _in_process(monkeypatch, svc)
    common = ["--controller", "http://ctl", "--token", tok]
    r = runner.invoke(app, ["power", "status", str(oid), "--json", *common])
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["savings"])
    r = runner.invoke(app, ["power", "status", "--json", *common])
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["orders"][0]["savings"])
    r = runner.invoke(app, ["energy", "report", "--since", "1d", "--json", *common])
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["power_orders"][0])
    r = runner.invoke(app, ["energy", "report", "--since", "1d", *common])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if f"order {oid}" in ln)
    assert "saved 0.140 kWh (0.014 USD)" in line and "700 W -> 560 W" in line
    assert "slowdown 10.0%" in line and "11.1% less, 0.070 kWh (0.007 USD)" in line
    r = runner.invoke(app, ["power", "status", str(oid), *common])
    assert r.exit_code == 0 and "slowdown 10.0%" in r.output, r.output


def test_no_progress_is_slowdown_unknown_and_a_gpu_without_a_job_is_itself(
    make_service: Callable[..., ControlService],
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc, oid, _ = _fleet(make_service, clock, with_job=False)
    c = TestClient(create_app(svc))
    tok = svc.store.tokens.create("viewer")[0]
    sv = c.get(f"/api/v1/power/orders/{oid}", headers=_auth(tok)).json()["savings"]
    assert sv["basis"] == "gpu" and sv["gpus"] == 1
    assert sv["saved_kwh"] == pytest.approx((BEFORE_W - DURING_W) * 3600 / 3.6e6)
    # a job placed on the GPU 30 minutes into the order: another workload, not compared
    _job(svc, 0, BASE + 1800)
    sv = c.get(f"/api/v1/power/orders/{oid}", headers=_auth(tok)).json()["savings"]
    assert sv["during"] == {"from_s": BASE + 60, "to_s": BASE + 1800}
    assert sv["gpu_hours"] == pytest.approx(1740 / 3600)
    assert sv["saved_kwh"] == pytest.approx((BEFORE_W - DURING_W) * 1740 / 3.6e6)
    assert sv["slowdown"] is None and sv["slowdown_gpus"] == 0
    assert sv["energy_per_work_saved"] is None and sv["jobs"] == []
    _in_process(monkeypatch, svc)
    common = ["--controller", "http://ctl", "--token", tok]
    r = runner.invoke(app, ["power", "status", str(oid), *common])
    assert r.exit_code == 0, r.output
    assert "slowdown unknown (no job progress reported)" in r.output
    r = runner.invoke(app, ["power", "status", *common])
    assert r.exit_code == 0 and "unknown" in r.output, r.output


def test_an_order_not_yet_reported_compares_nothing(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc = make_service(policy=RemediationPolicy(energy_price_per_kwh=PRICE))
    push(svc, batch("n1", 1, gpus=2, t=T0, k=1))
    svc.flush_rollups()
    oid = ops.create(svc.store, PowerOrderSpec(limit_w=DURING_W, nodes=["n1"]), ADMIN)
    c = TestClient(create_app(svc))
    tok = svc.store.tokens.create("viewer")[0]
    sv = c.get(f"/api/v1/power/orders/{oid}", headers=_auth(tok)).json()["savings"]
    assert sv["gpus"] == 0 and sv["saved_kwh"] is None and sv["slowdown"] is None
    assert sv["not_compared"] == [{"node": "n1", "gpu": None, "reason": "no agent report yet"}]
    assert "cost_saved" not in sv


def test_progress_input_is_checked(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    svc, _, job = _fleet(make_service, clock, with_job=True)
    assert job is not None
    c = TestClient(create_app(svc))
    tok = svc.store.tokens.create("operator")[0]
    viewer = svc.store.tokens.create("viewer")[0]

    def post(body: dict[str, Any], t: str = tok) -> Any:
        return c.post("/api/v1/energy/progress", json=body, headers=_auth(t))

    assert post({"job": job, "done": 1, "unit": "steps"}).json() == {"accepted": True}
    assert post({"job": job, "done": 2, "unit": "steps"}).json() == {"accepted": False}  # < 10 s
    clock.advance(30)
    r = post({"job": job, "done": 3, "unit": "tokens"})
    assert r.status_code == 422 and "unit" in r.text and "'steps'" in r.text
    assert post({"job": "999", "done": 3, "unit": "steps"}).status_code == 404
    assert post({"job": job, "done": -1, "unit": "steps"}).status_code == 422
    assert post({"job": job, "done": 3, "unit": "steps"}, viewer).status_code == 403
    r = post({"job": job, "done": 3, "unit": "steps", "at_s": clock() + 3600})
    assert r.status_code == 422 and "at_s" in r.text


def test_the_baseline_is_one_limit_and_one_job(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    """An earlier order put back 40 minutes before (its 500 W left out of the baseline) and a
    job that started 30 minutes before (the 900 W before it left out too): the baseline is the
    30 minutes at 700 W, and a tenant token reads no global order."""
    svc = make_service(policy=RemediationPolicy(energy_price_per_kwh=PRICE))
    push(svc, batch("n1", 1, gpus=2, t=T0, k=1))
    svc.flush_rollups()
    clock.advance(BASE - 6000 - clock())
    early = ops.create(svc.store, PowerOrderSpec(limit_w=500.0, nodes=["n1"], gpus=[0]), ADMIN)
    rows = [WireGpuPower(gpu=0, from_w=BEFORE_W, to_w=500.0, ok=True)]
    rep = WirePowerReport(
        node="n1", key=ops.order_key(early, "n1", "apply"), gpus=rows, done_s=BASE - 5990
    )
    assert ops.report(svc.store, rep, ADMIN)
    clock.advance(BASE - 2410 - clock())
    ops.restore(svc.store, early, ADMIN)
    rep = WirePowerReport(
        node="n1", key=ops.order_key(early, "n1", "restore"), gpus=rows, done_s=BASE - 2400
    )
    assert ops.report(svc.store, rep, ADMIN)
    _minutes(svc, "n1", 0, BASE - 3600, 20, 500.0)  # the earlier order's limit
    _minutes(svc, "n1", 0, BASE - 2400, 10, EARLIER_W)  # another workload, no job
    _minutes(svc, "n1", 0, BASE - 1800, 30, BEFORE_W)  # the job, before the order
    _minutes(svc, "n1", 0, BASE + 60, 60, DURING_W)
    _job(svc, 0, BASE - 1800)
    oid = _order(svc, clock, [0])
    clock.advance(BASE + 3690 - clock())
    c = TestClient(create_app(svc))
    tok = svc.store.tokens.create("viewer")[0]
    sv = c.get(f"/api/v1/power/orders/{oid}", headers=_auth(tok)).json()["savings"]
    assert sv["before"] == {"from_s": BASE - 1800, "to_s": BASE}
    assert sv["before_w"] == pytest.approx(BEFORE_W)
    assert sv["saved_kwh"] == pytest.approx((BEFORE_W - DURING_W) * 3600 / 3.6e6)
    # the earlier order: nothing was measured in the hour before it, so nothing to compare
    first = c.get(f"/api/v1/power/orders/{early}", headers=_auth(tok)).json()["savings"]
    assert first["gpus"] == 0 and first["saved_kwh"] is None
    assert first["not_compared"][0]["reason"] == "no energy measured in the baseline window"
    tenant = svc.store.tokens.create("viewer", tenant="acme")[0]
    rep_t = c.get("/api/v1/energy", params={"since": "1d"}, headers=_auth(tenant)).json()
    assert rep_t["power_orders"] == []
    rep_a = c.get("/api/v1/energy", params={"since": "1d"}, headers=_auth(tok)).json()
    assert [o["order"] for o in rep_a["power_orders"]] == [oid, early]
