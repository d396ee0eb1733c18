"""Issue 31, planner part: storage and fabric follow the workload, against hand-computed values.

- HPC/rendering read their input from shared storage: read = dataset (x nodes when every node
  loads all of it) / read time; a parallel FS when the workload spans nodes or reads > 10 GB/s.
- A compute (east-west) fabric only where parallelism spans nodes: single-node inference replicas
  get none; multi-node training and multi-node replicas keep theirs.
- Management (UFM) nodes on the compute fabric as the NVIDIA DGX SuperPOD with DGX B200 RA,
  "Network Fabrics", Table 4 "Compute fabric component count" places them: 1/2/3/4 SU = 31/63/95/
  127 nodes, 8/16/24/32 leaf, 4/8/16/16 spine, 252/508/764/1,020 "Compute and UFM" cables (8 per
  node + 4 UFM) and 256/512/768/1,024 spine-leaf cables.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import ParseError
from gpufleet.plan.cablemap import cable_map
from gpufleet.plan.fabric import Layout
from gpufleet.plan.planner import CandidatePlan, plan
from gpufleet.plan.spec import load_spec
from gpufleet.plan.storage import HpcIo, hpc_io
from tests.plan.builders import assert_cable_map_matches, fabric

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _text(out: str) -> str:
    """The terminal output with the table's borders and line wraps taken out."""
    return " ".join(w for w in out.split() if w not in {"│", "┃"})


def _best(spec: dict[str, Any]) -> CandidatePlan:
    best = plan(load_spec(spec)).best
    assert best is not None and best.fabric is not None and best.storage is not None
    return best


def _hpc(**kw: Any) -> dict[str, Any]:
    return {"candidates": ["dgx-h100"], "workloads": [{"kind": "hpc", **kw}]}


# --- 1. HPC and rendering storage ---------------------------------------------------------


def test_cfd_plan_gets_a_parallel_fs_with_its_input_read_bandwidth() -> None:
    best = _best(_hpc(name="cfd", precision="fp64", gpus=32, values=2e11))
    s = best.storage
    assert s is not None
    # 2e11 fp64 values x 8 B = 1.6e12 B, split over 32 / 8 = 4 nodes, read in 300 s (default)
    # = 5.33e9 B/s; 4 nodes share one namespace -> a parallel FS though below 10 GB/s
    assert s.hpc_read_bytes_per_s == pytest.approx(1.6e12 / 300)
    assert s.parallel_fs_recommended
    assert "cfd spans 4 nodes" in s.reason and "5.3 GB/s" in s.reason
    assert s.capacity_bytes == pytest.approx(1.6e12)  # the input, once; no checkpoints
    # a CFD code exchanges halos every step: its 4 nodes keep a compute fabric (8 NICs each)
    assert best.fabric is not None and best.fabric.compute.endpoint_links == 4 * 8
    assert "one coupled run over 4 nodes" in best.fabric.compute_reason


def test_rendering_plan_gets_a_parallel_fs_and_no_east_west_fabric() -> None:
    best = _best(
        _hpc(
            name="render",
            precision="fp32",
            tensor_cores=False,
            gpus=64,
            coupled=False,
            dataset="200 GB",
            dataset_per_node=True,
            read_time="10 min",
        )
    )
    s, f = best.storage, best.fabric
    assert s is not None and f is not None
    # every one of 64 / 8 = 8 nodes loads the 200 GB scene within 600 s: 8 x 200e9 / 600
    assert s.hpc_read_bytes_per_s == pytest.approx(8 * 200e9 / 600)  # 2.67 GB/s
    assert s.parallel_fs_recommended and "render spans 8 nodes" in s.reason
    assert "8 nodes x 0.20 TB each in 600 s = 2.7 GB/s" in s.reason
    # frames render independently: nothing crosses between nodes
    assert f.compute.levels == 0 and f.compute.endpoint_links == 0
    assert "independent tasks" in f.compute_reason
    assert f.storage.endpoint_links == 8 * 2  # storage stays: 2 storage NICs per DGX H100


def test_one_node_hpc_needs_a_parallel_fs_only_above_10_gb_s() -> None:
    # 1e11 values x 8 B = 0.8 TB on one node: in 60 s = 13.3 GB/s (> 10), in 300 s = 2.67 GB/s
    fast = hpc_io(HpcIo("a", 1, 0.8e12, 60.0))
    slow = hpc_io(HpcIo("a", 1, 0.8e12, 300.0))
    assert fast.read_bytes_per_s == pytest.approx(0.8e12 / 60) and fast.parallel_fs
    assert "above one NFS server" in fast.reason
    assert slow.read_bytes_per_s == pytest.approx(0.8e12 / 300) and not slow.parallel_fs


def test_unknown_hpc_dataset_is_none_not_zero() -> None:
    best = _best(_hpc(name="sweep", precision="fp64", gpus=16))  # no memory/values/dataset
    s = best.storage
    assert s is not None and s.hpc_read_bytes_per_s is None
    assert s.workloads[0].read_bytes_per_s is None and "dataset unknown" in s.reason


def test_example_hpc_and_rendering_plan_has_a_parallel_fs(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    spec = ROOT / "examples" / "hpc-and-rendering.yaml"
    r = runner.invoke(app, ["plan", str(spec), "--html", str(html)])
    assert r.exit_code == 0, r.output
    assert "parallel file system (cfd-fp64 spans" in _text(r.stdout)
    page = html.read_text()
    assert "cfd-fp64 input read" in page and "render-fp32 input read" in page
    doc = json.loads(runner.invoke(app, ["plan", str(spec), "--json"]).stdout)
    chosen = next(c for c in doc["candidates"] if c["candidate"] == doc["chosen"])
    assert chosen["storage"]["parallel_fs_recommended"] is True
    assert [w["name"] for w in chosen["storage"]["workloads"]] == ["cfd-fp64", "render-fp32"]


# --- 2. east-west fabric follows the parallelism ------------------------------------------


def _inference(tp: int, **kw: Any) -> dict[str, Any]:
    return {
        "candidates": ["dgx-h200"],
        "workloads": [
            {
                "kind": "inference",
                "name": "chat",
                "model": {
                    "parameters": 70e9,
                    "layers": 80,
                    "hidden_size": 8192,
                    "heads": 64,
                    "kv_heads": 8,
                },
                "context_length": 8192,
                "concurrent_sequences": 4096,
                "target_tokens_per_s": 200000,
                "tensor_parallel": tp,
                **kw,
            }
        ],
    }


def test_single_node_inference_replicas_get_no_compute_fabric(tmp_path: Path) -> None:
    best = _best(_inference(8))
    f = best.fabric
    assert f is not None and best.servers > 1
    inf = best.workloads[0].inference
    assert inf is not None and inf.gpus_per_replica == 8  # tp 8 = one DGX H200's 8 GPUs
    # each replica is one node: no east-west traffic, 0 compute leaves, uplinks and cables
    c = f.compute
    assert (c.levels, c.leaves, c.spines, c.endpoint_links, c.leaf_spine_links) == (0, 0, 0, 0, 0)
    assert "no compute (east-west) fabric" in f.compute_reason
    assert f"{inf.replicas} replicas of 8 GPUs, each inside one 8-GPU node" in f.compute_reason
    # the storage and in-band (front-end) networks stay: 2 storage NICs + 1 in-band port a node
    assert f.storage.endpoint_links == best.servers * 2
    assert f.inband.endpoint_links == best.servers
    assert best.layout is not None and best.facility is not None
    cables = cable_map(f, best.layout, best.facility.pdus)
    assert not [x for x in cables if x.network == "compute"]
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(_inference(8)))
    r = runner.invoke(app, ["plan", str(spec)])
    assert r.exit_code == 0, r.output
    assert "none: no workload spans nodes" in _text(r.stdout)


def test_example_inference_fleet_has_no_east_west_fabric() -> None:
    spec = ROOT / "examples" / "inference-fleet.yaml"
    result = plan(load_spec(spec.read_text(), spec.name))
    for cp in result.candidates:
        inf = cp.workloads[0].inference if cp.workloads else None
        if cp.fabric is None or inf is None or inf.gpus_per_replica > cp.server.gpus:
            continue
        assert cp.fabric.compute.endpoint_links == 0, cp.candidate


def test_multi_node_inference_replica_keeps_a_compute_fabric() -> None:
    # tp 16 on 8-GPU nodes: each replica spans 16 / 8 = 2 nodes (16 divides 64 heads; 16 is a
    # multiple of 8 KV heads, so vLLM-style KV replication applies)
    best = _best(_inference(16))
    f, inf = best.fabric, best.workloads[0].inference
    assert f is not None and inf is not None and inf.nodes_per_replica == 2
    assert f.compute.endpoint_links == best.servers * 8  # 8 compute NICs a DGX H200
    assert "each 16-GPU replica spans 2 nodes" in f.compute_reason


def test_multi_node_training_keeps_its_fabric() -> None:
    spec = ROOT / "examples" / "training-1024.yaml"
    best = plan(load_spec(spec.read_text(), spec.name)).best
    assert best is not None and best.fabric is not None
    c = best.fabric.compute
    # 1,024 GPUs / 8 = 128 nodes: the DGX SuperPOD B200 RA 4-SU counts (Table 3)
    assert (c.leaves, c.spines, c.endpoint_links, c.leaf_spine_links) == (32, 16, 1024, 1024)
    why = best.fabric.compute_reason
    assert "over 128 nodes" in why and "all-reduces gradients between nodes" in why


# --- 3. management (UFM) nodes on the compute fabric --------------------------------------


def _superpod(gpus: int, **constraints: Any) -> dict[str, Any]:
    return {
        "candidates": ["dgx-b200"],
        "workloads": [{"kind": "gpus", "gpus": gpus}],
        "constraints": {
            "rack_power": "60 kW",
            "cooling": "air",
            "management_nodes_per_su": 1,
            **constraints,
        },
    }


RA_TABLE_4 = [  # (SU, nodes, leaf, spine, compute + UFM cables, spine-leaf cables)
    (1, 31, 8, 4, 252, 256),
    (2, 63, 16, 8, 508, 512),
    (3, 95, 24, 16, 764, 768),
    (4, 127, 32, 16, 1020, 1024),
]


@pytest.mark.parametrize(("su", "nodes", "leaf", "spine", "node_leaf", "leaf_spine"), RA_TABLE_4)
def test_ufm_on_the_compute_fabric_reproduces_the_ra(
    su: int, nodes: int, leaf: int, spine: int, node_leaf: int, leaf_spine: int
) -> None:
    best = _best(_superpod(nodes * 8))
    f = best.fabric
    assert f is not None and best.servers == nodes and best.management_nodes == su
    c = f.compute
    assert (c.leaves, c.spines, c.cores) == (leaf, spine, 0)
    assert (c.endpoint_links, c.leaf_spine_links) == (node_leaf, leaf_spine)
    assert c.management_links == 4 and "no extra switch" in f.management_reason


def test_1024_gpu_superpod_cable_map_counts_the_ufm_cables(tmp_path: Path) -> None:
    """RA 4 SU: 127 DGX B200 x 8 + 4 UFM = 1,020 node-leaf, 1,024 leaf-spine compute cables."""
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(_superpod(127 * 8, management_nodes_per_su=4)))
    out = tmp_path / "cables.csv"
    r = runner.invoke(app, ["plan", str(spec), "--cable-map", str(out)])
    assert r.exit_code == 0, r.output
    assert "1020 + 1024 + 0 links (4 of them UFM)" in _text(r.stdout)
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    compute = [x for x in rows if x["network"] == "compute"]
    assert Counter(x["tier"] for x in compute) == {"node-leaf": 1020, "leaf-spine": 1024}
    ufm = [x for x in compute if x["a_device"].startswith("mgmt")]
    # 4 links on rails 1-4 of the 128th node slot: slot 127 is group 3, port 127 % 32 + 1 = 32
    # of leaves r x 4 groups + 3 + 1 = 4, 8, 12, 16
    assert sorted((x["b_device"], x["b_port"]) for x in ufm) == [
        ("compute-leaf004", "32"),
        ("compute-leaf008", "32"),
        ("compute-leaf012", "32"),
        ("compute-leaf016", "32"),
    ]
    assert {x["a_device"] for x in ufm} == {"mgmt001", "mgmt002", "mgmt003", "mgmt004"}


def test_128_full_nodes_plus_ufm_grow_the_tree_and_say_so() -> None:
    # 128 nodes fill all 32 x 32 leaf node ports; UFM takes a 129th slot: ceil(129 / 32) = 5
    # groups x 8 rails = 40 leaves; 40 x 32 uplinks / 64 ports = 20 spines, raised to 32, the
    # smallest count >= 20 that divides 32 uplinks evenly
    best = _best(_superpod(1024))
    c = best.fabric.compute if best.fabric else None
    assert c is not None and (c.leaves, c.spines, c.endpoint_links) == (40, 32, 1024 + 4)
    assert any("127 nodes in 4 SU" in n and "grows from 32 leaf" in n for n in best.notes)
    # management_compute_links: 0 keeps UFM off the compute fabric: the RA's 128-node counts
    off = _best(_superpod(1024, management_compute_links=0)).fabric
    assert off is not None
    assert (off.compute.leaves, off.compute.spines, off.compute.endpoint_links) == (32, 16, 1024)


@pytest.mark.parametrize(("servers", "mgmt", "links"), [(3, 1, 4), (40, 2, 4), (127, 4, 10)])
def test_management_links_cable_map_matches_the_bom(servers: int, mgmt: int, links: int) -> None:
    layout = Layout(-(-servers // 4), 4, 12, 0.6, 2.4)
    f = fabric(servers, layout, pdus=2, management_nodes=mgmt)
    assert f.compute.management_links == 0  # the builder keeps them off by default
    from gpufleet.plan.fabric import plan_fabric

    f = plan_fabric(
        servers=servers,
        compute_nics=8,
        storage_nics=2,
        radix=64,
        port_gbps=400,
        layout=layout,
        pdus=2,
        management_nodes=mgmt,
        management_compute_links=links,
    )
    assert f.compute.endpoint_links == servers * 8 + links
    cables = cable_map(f, layout, 2)
    assert_cable_map_matches(f, cables)  # every link once, as the BOM counts them
    assert all(1 <= int(x.b_port) <= 64 for x in cables if x.network == "compute")


@pytest.mark.parametrize("bad", [-1, 300, "yes"])
def test_bad_management_compute_links_names_the_field(bad: object) -> None:
    with pytest.raises(ParseError, match="management_compute_links"):
        load_spec(_superpod(256, management_compute_links=bad))
