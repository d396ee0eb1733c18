"""Issue 31: a fault is named where it is. One GPU's NVLink errors flag that GPU and link, not
its node's eight GPUs; a slow leaf switch or rail is one finding, not one per node."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.devices.sim import Fault, FaultKind
from gpufleet.errors import ConfigError
from gpufleet.validate import fabric_groups as fg
from gpufleet.validate.multinode_run import MultiNodePlan, report_from_result
from gpufleet.validate.pairwise import round_robin
from gpufleet.validate.results import Status, TestResult
from gpufleet.validate.thresholds import Thresholds
from tests.validate.conftest import run_sim


# ----- NVLink errors on one GPU --------------------------------------------------------------
def test_nvlink_errors_on_gpu3_flag_gpu3_and_its_link_only() -> None:
    fault = Fault(FaultKind.NVLINK_ERRORS, node="sim-01", gpu=3, params={"link": 5})
    report = run_sim("6x8xh200", level=3, faults=(fault,), stress_s=10.0)
    assert [s.component for s in report.stragglers] == ["sim-01/gpu3"]
    p2p = [r for r in report.results if r.test == "nvlink_p2p" and r.status is Status.FAIL]
    assert [r.component for r in p2p] == ["sim-01/gpu3"]
    assert p2p[0].details["links"] == [5] and "NVLink 5" in p2p[0].message
    # the node's collective is slow on every rank; it names the GPU and link that slow it
    coll = next(r for r in report.results if r.test == "collectives" and r.node == "sim-01")
    assert coll.status is Status.FAIL
    assert coll.details["slowed_by"] == ["sim-01/gpu3"] and "NVLink 5" in coll.message
    others = [r for r in report.results if r.test == "collectives" and r.node != "sim-01"]
    assert others and all(r.status is Status.PASS for r in others)


# ----- leaf and rail grouping ----------------------------------------------------------------
LEAVES = {"L1": range(0, 6), "L2": range(6, 10), "L3": range(10, 16)}


def _topology_conf(tmp_path: Path) -> Path:
    path = tmp_path / "topology.conf"
    lines = [
        f"SwitchName={leaf} Nodes=sim-[{r.start:02d}-{r.stop - 1:02d}]"
        for leaf, r in LEAVES.items()
    ]
    path.write_text("\n".join([*lines, "SwitchName=spine Switches=L[1-3]"]) + "\n")
    return path


def test_every_node_under_one_slow_leaf_is_one_leaf_finding(tmp_path: Path) -> None:
    topo = fg.load_topology(_topology_conf(tmp_path))
    slow = tuple(
        Fault(FaultKind.SLOW_LINK, node=f"sim-{i:02d}", params={"fraction": 0.5})
        for i in LEAVES["L2"]
    )
    report = run_sim("16x8xh200", level=3, faults=slow, stress_s=10.0, topology=topo)
    groups = [r for r in report.results if "group" in r.details]
    assert len(groups) == 1
    assert groups[0].details["name"] == "L2" and groups[0].status is Status.FAIL
    assert groups[0].details["nodes"] == [f"sim-{i:02d}" for i in LEAVES["L2"]]
    assert "leaf L2: 4 of 4 nodes slow" in groups[0].message
    per_node = [r for r in report.results if r.test == "pairwise" and r.status is Status.FAIL]
    assert all(r.details.get("explained_by") == ["leaf L2"] for r in per_node if r not in groups)


def test_without_a_topology_nothing_is_grouped_and_the_report_says_so() -> None:
    slow = (Fault(FaultKind.SLOW_LINK, node="sim-01", params={"fraction": 0.5}),)
    report = run_sim("6x8xh200", level=3, faults=slow, stress_s=10.0)
    assert not [r for r in report.results if "group" in r.details]
    assert fg.NO_TOPOLOGY_NOTE in report.notes


def _cable_map(nodes: list[str], rails: int, group_size: int) -> str:
    """Rail-optimized: node i's nicR goes to leaf (rail R, group i // group_size)."""
    head = "network,tier,a_device,a_port,b_device,b_port\n"
    rows = [
        f"compute,node-leaf,{n},nic{r + 1},leaf-r{r}-g{i // group_size},{i % group_size + 1}"
        for i, n in enumerate(nodes)
        for r in range(rails)
    ]
    return head + "\n".join(rows) + "\n"


def _doc(nodes: list[str], rails: int, slow: set[tuple[str, int]]) -> dict[str, object]:
    """Rank 0's result: every pair both ways, each rank 1 GB in 0.1 s (10 GB/s), 0.25 s (4
    GB/s) where either end's (node, rail) is slow."""
    pairs = []
    for rnd in round_robin(nodes):
        for a, b in rnd:
            for s, t in ((a, b), (b, a)):
                for r in range(rails):
                    bad = (s, r) in slow or (t, r) in slow
                    pairs.append(
                        {"sender": s, "receiver": t, "local_rank": r, "nbytes": 10**9,
                         "seconds": 0.25 if bad else 0.1}
                    )  # fmt: skip
    return {"nodes": nodes, "world_size": len(nodes) * rails, "backend": "gloo", "pairs": pairs}


NODES = [f"n{i:02d}" for i in range(8)]


def _judge(slow: set[tuple[str, int]], tmp_path: Path) -> list[TestResult]:
    path = tmp_path / "cables.csv"
    path.write_text(_cable_map(NODES, rails=4, group_size=4))
    plan = MultiNodePlan(hosts=NODES, tests=["pairwise"], ranks_per_node=4)
    plan.topology = fg.load_topology(path)
    report = report_from_result(_doc(NODES, 4, slow), plan, Thresholds(), 3, "torch-gloo")
    return [r for r in report.results if "group" in r.details]


def test_one_bad_rail_across_nodes_is_one_rail_finding(tmp_path: Path) -> None:
    groups = _judge({(n, 2) for n in NODES}, tmp_path)
    assert [(g.details["group"], g.details["name"]) for g in groups] == [("rail", "2")]
    assert "rail 2: 8 of 8 nodes on this rail slow" in groups[0].message


def test_one_bad_rail_leaf_is_one_leaf_finding(tmp_path: Path) -> None:
    # leaf-r1-g1 carries rail 1 of nodes 4-7
    groups = _judge({(n, 1) for n in NODES[4:]}, tmp_path)
    assert [(g.details["group"], g.details["name"]) for g in groups] == [("leaf", "leaf-r1-g1")]
    assert groups[0].details["nodes"] == NODES[4:]


def test_bad_topology_files_are_refused_with_the_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.conf"
    bad.write_text("Nodes=a[1-2]\n")
    with pytest.raises(ConfigError, match=r"t\.conf:1"):
        fg.load_topology(bad)
    csv = tmp_path / "c.csv"
    csv.write_text("a_device,b_device\nx,y\n")
    with pytest.raises(ConfigError, match=r"c\.csv: not a cable map"):
        fg.load_topology(csv)
