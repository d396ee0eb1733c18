"""Resource limits on ingest, through the HTTP path agents use: an agent token not bound to a
node pushes for at most ``max_nodes_per_token`` nodes (the count survives a restart; bound and
admin tokens are not counted), a node has at most 16 GPUs (the catalog's largest system fits),
and the answers are 4xx naming the limit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from gpufleet.catalog.loader import load_catalog
from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService
from gpufleet.wire.limits import MAX_GPUS_PER_NODE
from tests.control.conftest import batch


def _push(client: TestClient, token: str, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})


def test_an_unbound_agent_token_pushes_for_a_limited_number_of_nodes(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service(max_nodes_per_token=3)
    unbound = svc.store.tokens.create("agent", name="bootstrap")[0]
    client = TestClient(create_app(svc))
    for i in range(3):
        assert _push(client, unbound, batch(f"n{i}", 1)).status_code == 200
    refused = _push(client, unbound, batch("n3", 1))
    assert refused.status_code == 403
    detail = refused.json()["detail"]
    assert "--max-nodes-per-token 3" in detail and "bootstrap" in detail
    assert _push(client, unbound, batch("n0", 2)).status_code == 200  # its own nodes go on
    bound = svc.store.tokens.create("agent", node="n3")[0]
    assert _push(client, bound, batch("n3", 1)).status_code == 200
    admin = svc.store.tokens.create("admin")[0]
    assert _push(client, admin, batch("n4", 1)).status_code == 200
    other = svc.store.tokens.create("agent")[0]  # the limit is per token
    assert _push(client, other, batch("n5", 1)).status_code == 200
    # a restarted controller counts the token's nodes from the database
    again = make_service(max_nodes_per_token=3)
    client2 = TestClient(create_app(again))
    assert _push(client2, unbound, batch("n6", 1)).status_code == 403
    assert _push(client2, unbound, batch("n1", 2)).status_code == 200


def test_no_more_gpus_per_node_than_the_limit(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service()
    token = svc.store.tokens.create("agent")[0]
    client = TestClient(create_app(svc))
    fits = batch("big", 1, gpus=MAX_GPUS_PER_NODE)
    assert _push(client, token, fits).status_code == 200
    over = batch("bigger", 1, gpus=MAX_GPUS_PER_NODE + 1)
    r = _push(client, token, over)
    assert r.status_code == 422
    assert str(MAX_GPUS_PER_NODE) in r.json()["detail"], r.json()
    assert "bigger" not in {
        n["name"]
        for n in client.get(
            "/api/v1/nodes",
            headers={"Authorization": f"Bearer {svc.store.tokens.create('viewer')[0]}"},
        ).json()["nodes"]
    }


def test_every_catalog_system_fits_the_gpu_limit() -> None:
    systems = list(load_catalog().systems.values())
    assert systems
    assert all(0 < s.gpus <= MAX_GPUS_PER_NODE for s in systems), [(s.key, s.gpus) for s in systems]


def test_an_agent_with_too_many_gpus_is_refused_at_start(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.app import app
    from gpufleet.errors import UsageError

    res = CliRunner().invoke(
        app,
        [
            "agent",
            "--sim",
            f"1x{MAX_GPUS_PER_NODE + 1}xh100-sxm",
            "--controller",
            "http://127.0.0.1:9",
            "--token",
            "gf_" + "x" * 43,
            "--state-dir",
            str(tmp_path),
        ],
    )
    assert isinstance(res.exception, UsageError), res.output
    assert f"at most {MAX_GPUS_PER_NODE} per node" in str(res.exception)
