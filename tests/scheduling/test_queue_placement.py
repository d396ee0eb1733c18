"""Queue order, quotas and placement (best fit, one node, constraints, topology)."""

from __future__ import annotations

import pytest

from gpufleet.errors import UnknownNameError, UsageError
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.placement import GpuSlot, NodeInfo, check_feasible, place
from gpufleet.schedulers.embedded.queue import QueueEntry, Quotas, ordered

GIB = 2**30
H100 = ("h100-sxm", 80 * GIB)
H200 = ("h200-sxm", 141 * GIB)


def node(name: str, n: int = 8, kind: tuple[str, int] = H100, **topo: str) -> NodeInfo:
    return NodeInfo(name, tuple(GpuSlot(i, kind[0], kind[1]) for i in range(n)), **topo)


def test_order_is_priority_then_fifo() -> None:
    es = [
        QueueEntry("a", "t", 0, 1, 1),
        QueueEntry("b", "t", 5, 3, 1),
        QueueEntry("c", "t", 5, 2, 1),
        QueueEntry("d", "t", -1, 0, 1),
    ]
    assert [e.job_id for e in ordered(es)] == ["c", "b", "a", "d"]


def test_quota_counts_in_use_plus_wanted() -> None:
    q = Quotas({"a": 4})
    assert q.allows("a", 2, 2)
    assert not q.allows("a", 3, 2)
    assert q.allows("b", 100, 100)  # no entry: unlimited
    assert q.exceeds_alone("a", 5) and not q.exceeds_alone("a", 4)


def test_best_fit_picks_the_fullest_node_that_fits() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    used = {"n1": {0, 1}, "n2": {0, 1, 2, 3, 4}, "n3": set()}  # free: 6, 3, 8
    p = place(JobSpec("j", gpus=3), nodes, used)
    assert p is not None and p.nodes == ("n2",) and p.gpus == ((5, 6, 7),)
    p = place(JobSpec("j", gpus=4), nodes, used)
    assert p is not None and p.nodes == ("n1",) and p.gpus == ((2, 3, 4, 5),)


def test_one_node_job_is_never_split() -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    used = {"n1": {0, 1}, "n2": {2, 3}}  # 2 + 2 free, a 4-GPU job must wait
    assert place(JobSpec("j", gpus=4), nodes, used) is None


def test_model_and_memory_constraints() -> None:
    nodes = [node("small", 8, H100), node("big", 2, H200)]
    p = place(JobSpec("j", gpus=2, min_gpu_memory_bytes=100 * GIB), nodes, {})
    assert p is not None and p.nodes == ("big",)
    p = place(JobSpec("j", gpus=1, gpu_model="H200"), nodes, {})  # alias, any case
    assert p is not None and p.nodes == ("big",)
    assert place(JobSpec("j", gpus=3, gpu_model="h200"), nodes, {}) is None
    with pytest.raises(UsageError, match="only 0 of 2"):
        check_feasible(JobSpec("j", gpus=3, gpu_model="h200"), nodes)
    with pytest.raises(UnknownNameError):
        check_feasible(JobSpec("j", gpus=1, gpu_model="h300x"), nodes)
    with pytest.raises(UsageError, match="mig_profile"):
        check_feasible(JobSpec("j", mig_profile="1g.10gb"), nodes)


def test_multi_node_prefers_nvlink_domain_then_leaf_then_rack() -> None:
    nodes = [
        node("a1", 4, nvlink_domain="nvl-1", leaf_switch="leaf-1", rack="r1"),
        node("a2", 4, nvlink_domain="nvl-2", leaf_switch="leaf-1", rack="r1"),
        node("b1", 4, nvlink_domain="nvl-3", leaf_switch="leaf-2", rack="r2"),
        node("b2", 4, nvlink_domain="nvl-3", leaf_switch="leaf-2", rack="r2"),
    ]
    p = place(JobSpec("j", gpus=4, nodes=2), nodes, {})
    assert p is not None and p.nodes == ("b1", "b2") and p.scope == "nvlink_domain"
    p = place(JobSpec("j", gpus=4, nodes=2), nodes, {"b2": {0}})
    assert p is not None and p.nodes == ("a1", "a2") and p.scope == "leaf_switch"
    racks = [node("x1", 4, rack="r1"), node("y1", 4, rack="r2"), node("y2", 4, rack="r2")]
    p = place(JobSpec("j", gpus=2, nodes=2), racks, {})
    assert p is not None and p.nodes == ("y1", "y2") and p.scope == "rack"
    p = place(JobSpec("j", gpus=2, nodes=3), racks, {})
    assert p is not None and p.scope == "any" and len(p.nodes) == 3


def test_excluded_nodes_are_avoided() -> None:
    nodes = [node("n1", 4), node("n2", 8)]
    p = place(JobSpec("j", gpus=4), nodes, {}, exclude=["n1"])
    assert p is not None and p.nodes == ("n2",)
