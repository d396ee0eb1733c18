"""A power order is checked whole at the API, before anything is recorded (issue 29): a limit
outside a selected GPU's allowed range (as its agent reported NVML's constraints) or a JSON
``true`` for watts is a 422 naming the GPU or field, where both were accepted and then refused
by every GPU; a tenant's selector that reaches other tenants' nodes is refused without naming
any of them. In process: the real app on a real SQLite store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gpufleet.control.api.app import create_app
from gpufleet.control.db.models import PowerOrder
from gpufleet.control.service import ControlService
from tests.control.conftest import batch, push

ORDERS = "/api/v1/power/orders"


@pytest.fixture
def api(make_service: Callable[..., ControlService]) -> tuple[TestClient, dict[str, Any], Any]:
    svc = make_service()
    for name in ("pa", "pb"):
        body = batch(name, 1)
        for d in body["devices"]:  # NVML's power management limit constraints of an H100
            d["info"] |= {"power_limit_min_w": 200.0, "power_limit_max_w": 700.0}
        push(svc, body)
    admin = svc.store.tokens.create("admin")[0]
    client = TestClient(create_app(svc))
    for name, tenant in (("pa", "acme"), ("pb", "other")):
        r = client.patch(
            f"/api/v1/nodes/{name}",
            json={"tenant": tenant, "labels": {"role": "train"}},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 200, r.text
    tokens = {
        "admin": admin,
        "acme": svc.store.tokens.create("operator", tenant="acme")[0],
    }
    return client, tokens, svc


def _order(api: Any, token: str, body: dict[str, Any]) -> Any:
    client, tokens, _ = api
    return client.post(ORDERS, json=body, headers={"Authorization": f"Bearer {tokens[token]}"})


def _recorded(api: Any) -> int:
    with api[2].store.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(PowerOrder)) or 0)


@pytest.mark.parametrize("watts", [1, 199.5, 700.5])
def test_a_limit_outside_a_gpus_range_is_refused_naming_it(api: Any, watts: float) -> None:
    for dry_run in (True, False):
        r = _order(api, "admin", {"limit_w": watts, "nodes": ["pa"], "dry_run": dry_run})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == (
            f"limit {watts:g} W is outside GPU 0 of pa's allowed range 200-700 W; nothing applied"
        )
    per_gpu = {"per_node": {"pa": {"0": 400, "1": watts}}}
    r = _order(api, "admin", per_gpu)
    assert r.status_code == 422 and "GPU 1 of pa" in r.json()["detail"], r.text
    assert _recorded(api) == 0
    ok = _order(api, "admin", {"limit_w": 200, "nodes": ["pa"]})  # the range's own ends pass
    assert ok.status_code == 201, ok.text
    assert _recorded(api) == 1


def test_true_is_not_a_number_of_watts(api: Any) -> None:
    r = _order(api, "admin", {"limit_w": True, "nodes": ["pa"]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "limit_w"], r.text
    r = _order(api, "admin", {"per_node": {"pa": {"*": True}}})
    assert r.status_code == 422, r.text
    assert _recorded(api) == 0


def test_a_tenants_selector_reaching_other_tenants_is_refused_naming_none(api: Any) -> None:
    r = _order(api, "acme", {"limit_w": 400, "labels": {"role": "train"}})
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert "nothing applied" in detail and "pb" not in detail and "other" not in detail, detail
    assert _recorded(api) == 0
    ok = _order(api, "acme", {"limit_w": 400, "labels": {"role": "train"}, "tenant": "acme"})
    assert ok.status_code == 201, ok.text
    assert [n["node"] for n in ok.json()["nodes"]] == ["pa"]
