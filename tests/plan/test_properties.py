"""Invariants checked with hypothesis: power monotone in GPUs, switches enough, every endpoint
cabled once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.plan.fabric import Layout, fat_tree
from gpufleet.plan.planner import plan
from gpufleet.plan.spec import load_spec
from tests.hypothesis_budget import examples
from tests.plan.builders import fabric, facility


def _spec(gpus: int) -> dict[str, object]:
    return {
        "candidates": ["h100-sxm"],
        "workloads": [{"kind": "gpus", "gpus": gpus}],
        "constraints": {"rack_power": "40 kW"},
    }


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 2_000))
def test_more_gpus_never_lowers_power(gpus: int, extra: int) -> None:
    a = plan(load_spec(_spec(gpus))).best
    b = plan(load_spec(_spec(gpus + extra))).best
    assert a and b and a.facility and b.facility
    assert b.facility.it_kw >= a.facility.it_kw
    assert b.facility.facility_kw >= a.facility.facility_kw
    assert b.facility.racks >= a.facility.racks


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 8192), st.sampled_from([1, 2, 4, 8]), st.sampled_from([16, 32, 64, 128]))
def test_switch_ports_suffice(nodes: int, nics: int, k: int) -> None:
    if nodes * nics > k**3 // 4:
        return
    t = fat_tree(nodes, nics, k)
    assert t.endpoint_links == nodes * nics
    if t.levels == 1:
        assert t.endpoint_links <= k
        return
    assert t.leaves * (k // 2) >= t.endpoint_links  # leaf down-ports
    assert t.leaf_spine_links == t.leaves * (k // 2)  # non-blocking: up = down capacity
    assert (
        t.spines * k >= t.leaf_spine_links
        if t.levels == 2
        else t.spines * (k // 2) >= t.leaf_spine_links
    )
    assert t.cores * k >= t.spine_core_links


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 3000), st.integers(1, 6), st.integers(8, 30))  # < 2 km runs
def test_every_endpoint_cabled_once(servers: int, per_rack: int, per_row: int) -> None:
    racks = -(-servers // per_rack)
    f = fabric(servers, Layout(racks, per_rack, per_row, 0.6, 2.4), pdus=racks)
    for net, tree in (("compute", f.compute), ("storage", f.storage), ("in-band", f.inband)):
        lines = [c for c in f.cables if c.network == net]
        assert sum(c.count for c in lines if c.tier == "node-leaf") == tree.endpoints
        assert sum(c.count for c in lines if c.tier == "leaf-spine") == tree.leaf_spine_links
        assert sum(c.count for c in lines if c.tier == "spine-core") == tree.spine_core_links


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5000), st.floats(10.3, 150))
def test_racks_hold_all_servers_under_the_limit(servers: int, limit: float) -> None:
    f = facility(
        servers=servers,
        server_kw=10.2,
        server_ru=8,
        server_name="DGX H100",
        rack_limit_kw=limit,
        cooling="air",
        pue=None,
        voltage_v=208,
        current_a=60,
        redundancy="N+1",
        network_kw=0,
        average_load=1,
    )
    assert f.racks * f.servers_per_rack >= servers
    assert f.rack_load_kw <= limit + 1e-9
    assert f.circuits_per_rack * f.circuit_kw >= f.rack_load_kw
