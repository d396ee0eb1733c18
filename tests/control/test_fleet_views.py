"""Fleet-sized reads on a real controller (SQLite): the heatmap folded into rack groups agrees
with the ungrouped rows it summarises (counts, min/mean/max, worst health), folds only past
``max_cells``, and brings back the rows of expanded groups (the rackless ones too); the node
list searches, sorts by figures and pages on the server, and lists the nodes needing
attention worst first."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.testing import bulkfleet

NODES = 100
RACK = 16
LOOSE = ["loose-a", "loose-b"]  # registered through ingest: no rack


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    svc = ControlService(
        ServiceConfig(data_dir=tmp_path / "d", policy=RemediationPolicy(require_validation=False))
    )
    now = time.time()
    names = [f"gpu-{i:05d}" for i in range(NODES)]
    bulkfleet.register(svc.store, names, now, racks_of=RACK)
    bulkfleet.fill(svc.store, names, now, devices=False, fail_every=50)  # nodes 7 and 57 fail
    bulkfleet.fill(svc.store, LOOSE, now, devices=True, fail_every=0, seed=3)
    yield svc
    svc.engine.dispose()


@pytest.fixture
def api(svc: ControlService) -> tuple[TestClient, dict[str, str]]:
    token = svc.store.tokens.create("viewer", name="t")[0]
    return TestClient(create_app(svc)), {"Authorization": f"Bearer {token}"}


def get(api: tuple[TestClient, dict[str, str]], path: str, **params: Any) -> Any:
    client, h = api
    r = client.get(f"/api/v1{path}", params=params, headers=h)
    assert r.status_code == 200, r.text
    return r.json()


def test_groups_summarise_the_rows(api: tuple[TestClient, dict[str, str]]) -> None:
    full = get(api, "/heatmap", metric="gpu_temp_c")
    assert full["groups"] is None and len(full["nodes"]) == NODES + len(LOOSE)
    grouped = get(api, "/heatmap", metric="gpu_temp_c", group_by="rack", max_cells=0)
    assert grouped["nodes"] == [] and grouped["group_by"] == "rack"
    racks = sorted({f"r{i // RACK:03d}" for i in range(NODES)})
    assert [g["key"] for g in grouped["groups"]] == [*racks, None]  # rackless last
    for g in grouped["groups"]:
        idx = [i for i, r in enumerate(full["racks"]) if r == g["key"]]
        vals = [v for i in idx for v in full["values"][i] if v is not None]
        assert g["nodes"] == len(idx)
        assert g["gpus"] == sum(len(full["values"][i]) for i in idx)
        assert g["max"] == pytest.approx(max(vals))
        assert g["min"] == pytest.approx(min(vals))
        assert g["mean"] == pytest.approx(sum(vals) / len(vals))
        fails = sum(1 for i in idx if full["health"][i] == 2)
        assert g["by_health"]["fail"] == fails
        assert g["worst_health"] == (2 if fails else 0)
        assert g["out"] == sum(1 for i in idx if full["states"][i] == "draining")
    # racks r000 (node 7) and r003 (node 57) hold the failing, drained-away nodes
    worst = {g["key"]: g["worst_health"] for g in grouped["groups"]}
    assert worst["r000"] == 2 and worst["r003"] == 2 and worst["r001"] == 0


def test_folds_only_past_max_cells_and_expands(api: tuple[TestClient, dict[str, str]]) -> None:
    cells = (NODES + len(LOOSE)) * 8
    assert get(api, "/heatmap", group_by="rack", max_cells=cells)["groups"] is None
    assert get(api, "/heatmap", group_by="rack", max_cells=cells - 1)["groups"] is not None
    full = get(api, "/heatmap", metric="power_pct")
    got = get(api, "/heatmap", metric="power_pct", group_by="rack", expand=["r002", ""])
    want = [n for n, r in zip(full["nodes"], full["racks"], strict=True) if r in ("r002", None)]
    assert got["nodes"] == want and len(want) == RACK + len(LOOSE)
    rows = dict(zip(full["nodes"], full["values"], strict=True))
    assert got["values"] == [rows[n] for n in want]
    by_model = get(api, "/heatmap", group_by="model")
    assert [(g["key"], g["nodes"]) for g in by_model["groups"]] == [
        ("h100-sxm", NODES + len(LOOSE))
    ]


def test_node_list_sorts_searches_pages(api: tuple[TestClient, dict[str, str]]) -> None:
    every = get(api, "/nodes", gpus="true", limit=1000)["nodes"]

    def util(n: dict[str, Any]) -> float:
        v = [float(g["metrics"]["gpu_util_pct"]) for g in n["gpu_latest"]]
        return sum(v) / len(v)

    want = [n["name"] for n in sorted(every, key=lambda n: (-util(n), n["name"]))]
    pages = [
        get(api, "/nodes", sort="util", desc="true", gpus="false", limit=40, offset=o)
        for o in (0, 40, 80)
    ]
    assert all(p["total"] == NODES + len(LOOSE) for p in pages)
    assert [n["name"] for p in pages for n in p["nodes"]] == want
    found = get(api, "/nodes", q="R005", gpus="false")
    assert [n["name"] for n in found["nodes"]] == [f"gpu-{i:05d}" for i in range(80, 96)]
    att = get(api, "/nodes", attention="true", sort="attention", gpus="false")
    assert [n["name"] for n in att["nodes"]] == ["gpu-00007", "gpu-00057"]
    client, h = api
    bad = client.get("/api/v1/nodes", params={"sort": "nope"}, headers=h)
    assert bad.status_code == 422 and "sort" in bad.text


def test_rows_read_in_one_pass_match_the_per_node_reads(
    svc: ControlService, api: tuple[TestClient, dict[str, str]]
) -> None:
    """The fleet-wide read (one lock, arrays) gives what reading node by node gives, a GPU
    whose samples stopped (older than its node's newest by more than STALE_GPU_S) included."""
    from gpufleet.control.fleet import queries as qy
    from gpufleet.control.ingest.queue import parse_batch, queue_item
    from gpufleet.control.state.auth import Principal, Role

    # the other GPUs of gpu-00001 report 30 s later than GPU 3's newest sample (the fill's)
    body = bulkfleet.node_batch("gpu-00001", random.Random(1), time.time() + 30, seq=9)
    body["samples"] = [b for b in body["samples"] if b["gpu_index"] != 3]
    item = queue_item(
        parse_batch(json.dumps(body).encode(), time.time()),
        Principal(None, "t", Role.AGENT),
        time.time(),
    )
    svc.store.writer.call(lambda: svc.store.apply_batches([item]))
    store = svc.store
    for metric in ("gpu_util_pct", "power_pct", "gpu_temp_c", "health"):
        got = get(api, "/heatmap", metric=metric)
        want = [qy.heatmap_row(store, store.view.nodes[n], metric) for n in got["nodes"]]
        assert got["values"] == want, metric
    stale = get(api, "/heatmap", metric="gpu_util_pct")
    row = stale["values"][stale["nodes"].index("gpu-00001")]
    assert row[3] is None and row[2] is not None


def test_empty_selections_and_nodes_without_gpus(
    svc: ControlService, api: tuple[TestClient, dict[str, str]]
) -> None:
    from gpufleet.control.fleet import views as fv
    from gpufleet.control.ingest.queue import parse_batch, queue_item
    from gpufleet.control.state.auth import Principal, Role

    none = get(api, "/heatmap", group_by="rack", state="failed")  # no max_cells: always fold
    assert none["groups"] == [] and none["nodes"] == []
    # with max_cells, an empty selection fits: plain rows (none)
    assert get(api, "/heatmap", group_by="rack", max_cells=0, state="failed")["groups"] is None
    body = bulkfleet.node_batch("bare-0", random.Random(2), time.time(), devices=False)
    body["samples"] = []  # a node that reported no GPU at all
    now = time.time()
    item = queue_item(
        parse_batch(json.dumps(body).encode(), now), Principal(None, "t", Role.AGENT), now
    )
    svc.store.writer.call(lambda: svc.store.apply_batches([item]))
    bare = svc.store.view.nodes["bare-0"]
    assert not bare.gpus
    got = fv.heatmap(svc.store, [bare], "gpu_temp_c", group_by="rack", max_cells=None, expand=[""])
    assert got.nodes == ["bare-0"] and got.values == [[]]
    assert got.groups is not None
    g = got.groups[0]
    assert (g.key, g.nodes, g.gpus, g.mean, g.no_data) == (None, 1, 0, None, 0)
