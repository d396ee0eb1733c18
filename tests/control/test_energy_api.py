"""``GET /api/v1/energy`` on a real controller (SQLite and PostgreSQL): tenant scoping (tenant
B reads none of tenant A's energy), a bad ``since`` is a clear 422, cost and CO2 appear only
with a price and an intensity in the policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock

from .conftest import batch, push

WATTS = {"na": 300.0, "nb": 500.0}  # constant power per node: energy = W x seconds


def _body(node: str, seq: int, t: float, k: int) -> dict[str, Any]:
    b = batch(node, seq, gpus=2, t=t, k=k, devices=seq == 1)
    for s in b["samples"]:
        s["fields"]["power_w"] = [WATTS[node]] * k
        s["fields"]["gpu_util_pct"] = [50.0] * k
    return b


def _fleet(svc: ControlService, clock: ManualClock, minutes: int = 3) -> float:
    t0 = clock()
    for n in WATTS:
        for m in range(minutes):
            push(svc, _body(n, m + 1, t0 + 60 * m, 60))
            svc.flush_rollups()  # the controller's periodic flush (every 15 s)
    clock.advance(60 * minutes)
    svc.flush_rollups()
    return 60 * minutes - 1  # seconds integrated: samples at t0 .. t0 + 60*minutes - 1


def test_tenant_b_reads_none_of_tenant_a(
    make_service: Callable[..., ControlService], clock: ManualClock, db_config: dict[str, Any]
) -> None:
    policy = RemediationPolicy(energy_price_per_kwh=0.25, grid_gco2_per_kwh=350.0)
    svc = make_service(policy=policy, **db_config)  # SQLite and PostgreSQL (the upserts)
    push(svc, _body("na", 100, clock() - 10, 1))
    push(svc, _body("nb", 100, clock() - 10, 1))
    for node, tenant in (("na", "ta"), ("nb", "tb")):
        _set_tenant(svc, node, tenant)
    seconds = _fleet(svc, clock)
    c = TestClient(create_app(svc))
    admin = svc.store.tokens.create("admin")[0]
    tb = svc.store.tokens.create("viewer", tenant="tb")[0]

    def get(tok: str, **params: str) -> Any:
        return c.get("/api/v1/energy", params=params, headers={"Authorization": f"Bearer {tok}"})

    every = get(admin, by="tenant", since="1d").json()
    kwh = {r["key"]: r["kwh"] for r in every["rows"]}
    for node, tenant in (("na", "ta"), ("nb", "tb")):  # 2 GPUs x W x seconds (+ the first 10 s)
        want = 2 * WATTS[node] * (seconds + 10) / 3.6e6
        assert kwh[tenant] == pytest.approx(want, rel=0.01)
    row = next(r for r in every["rows"] if r["key"] == "ta")
    assert row["cost"] == pytest.approx(row["kwh"] * 0.25)
    assert row["co2_kg"] == pytest.approx(row["kwh"] * 0.35)
    assert row["method"] == "power"  # these batches carry no energy counter
    mine = get(tb, by="node", since="1d").json()
    assert [r["key"] for r in mine["rows"]] == ["nb"]
    assert mine["total"]["kwh"] == pytest.approx(kwh["tb"])
    assert [r["key"] for r in get(tb, by="tenant", since="30d").json()["rows"]] == ["tb"]
    # by day (UTC) and by GPU model: one row each here, adding up to the total
    day = get(admin, by="day", since="1d").json()
    assert [r["key"] for r in day["rows"]] == ["2023-11-14"]  # T0 = 1.7e9 s
    assert day["rows"][0]["kwh"] == pytest.approx(every["total"]["kwh"])
    model = get(admin, by="model", since="1d").json()
    assert [r["key"] for r in model["rows"]] == ["h100-sxm"]
    bad = get(admin, since="thirty days")
    assert bad.status_code == 422 and "since" in bad.text and "30d" in bad.text
    assert get(admin, by="rack").status_code == 422


def _set_tenant(svc: ControlService, node: str, tenant: str) -> None:
    from sqlalchemy import update

    from gpufleet.control.db.models import Node

    def run() -> None:
        with svc.store.sessions.begin() as s:
            s.execute(update(Node).where(Node.name == node).values(tenant=tenant))
        svc.store.load([node])

    svc.store.writer.call(run)


def test_energy_minutes_older_than_the_retention_are_deleted(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    from gpufleet.control.db.models import EnergyMinute

    svc = make_service(energy_retention_s=3600.0)
    _fleet(svc, clock, minutes=1)
    with svc.store.sessions() as s:
        assert s.query(EnergyMinute).count() >= 4  # 2 nodes x 2 GPUs, one or two minutes
    clock.advance(3600.0 + 120)
    svc.tick()
    with svc.store.sessions() as s:
        assert s.query(EnergyMinute).count() == 0
