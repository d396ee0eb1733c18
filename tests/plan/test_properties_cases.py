"""Hypothesis invariants for the issue 17 cases: balanced spines, the cable map, tensor parallel
vs heads, HPC sizing, pilots, TCO with refresh and residual value, and the site plant."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpufleet.plan.cablemap import cable_map
from gpufleet.plan.cost import hardware_over_horizon
from gpufleet.plan.fabric import Layout, fat_tree
from gpufleet.plan.facility import ImpossibleConstraint
from gpufleet.plan.planner import plan
from gpufleet.plan.spec import load_spec
from tests.hypothesis_budget import examples
from tests.plan.builders import assert_cable_map_matches, fabric, plant


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 8192), st.sampled_from([1, 2, 4, 8]), st.sampled_from([16, 32, 64, 128]))
def test_spines_balance_and_are_the_fewest_that_do(nodes: int, nics: int, k: int) -> None:
    assume(nodes * nics <= k**3 // 4)
    t = fat_tree(nodes, nics, k)
    if t.levels != 2:
        return
    up = k // 2
    assert up % t.spines == 0  # every leaf sends the same number of links to every spine
    assert t.spines * k >= t.leaf_spine_links  # the spines hold every uplink
    # no smaller balanced count has the ports
    assert not any(up % s == 0 and s * k >= t.leaf_spine_links for s in range(1, t.spines))


@settings(max_examples=examples(40), deadline=None)
@given(
    st.integers(1, 700),
    st.integers(1, 6),
    st.integers(6, 20),
    st.sampled_from([1, 2, 8]),
    st.integers(0, 12),
)
def test_cable_map_is_every_link_once(
    servers: int, per_rack: int, per_row: int, nics: int, mgmt: int
) -> None:
    racks = -(-servers // per_rack)
    layout = Layout(racks, per_rack, per_row, 0.6, 2.4)
    f = fabric(servers, layout, pdus=racks, compute_nics=nics, management_nodes=mgmt)
    cables = cable_map(f, layout, racks)
    assert_cable_map_matches(f, cables)  # every link once, as the BOM counts them
    assert all(1 <= int(c.b_port) <= 64 for c in cables if c.network != "out-of-band")


_SHAPES = [(h, kv) for h in (12, 20, 24, 40, 48, 64, 96) for kv in (1, 2, 4, 8, h) if h % kv == 0]


@settings(max_examples=examples(25), deadline=None)
@given(st.sampled_from(_SHAPES), st.integers(8, 60), st.sampled_from([2048, 4096]))
def test_auto_tensor_parallel_divides_heads(shape: tuple[int, int], layers: int, seq: int) -> None:
    heads, kv = shape
    spec = {
        "candidates": ["h100-sxm"],
        "workloads": [
            {
                "kind": "training",
                "model": {
                    "layers": layers,
                    "hidden_size": heads * 128,
                    "heads": heads,
                    "kv_heads": kv,
                },
                "sequence_length": seq,
                "global_batch": 512,
                "tokens": 1e10,
                "gpus": 64,
            }
        ],
    }
    try:
        best = plan(load_spec(spec)).best
    except ImpossibleConstraint as exc:  # a model no allowed layout fits is explained
        assert "does not fit" in str(exc)
        return
    assert best and best.workloads[0].training
    tp = best.workloads[0].training.memory.tensor_parallel
    assert heads % tp == 0 and kv % tp == 0


@settings(max_examples=examples(30), deadline=None)
@given(st.floats(1, 50_000), st.floats(1.0, 4.0), st.sampled_from(["fp64", "fp32"]))
def test_hpc_meets_the_rate_and_more_rate_never_fewer_gpus(
    rate: float, factor: float, precision: str
) -> None:
    def sized(r: float) -> tuple[int, float]:
        best = plan(
            load_spec(
                {
                    "candidates": ["h100-sxm"],
                    "workloads": [{"kind": "hpc", "precision": precision, "sustained_tflops": r}],
                }
            )
        ).best
        assert best and best.workloads[0].hpc
        return best.gpus, best.workloads[0].hpc.sustained_tflops

    n1, s1 = sized(rate)
    n2, _ = sized(rate * factor)
    assert s1 >= rate * (1 - 1e-9)
    assert n2 >= n1 and n1 % 8 == 0


@settings(max_examples=examples(15), deadline=None)
@given(st.integers(1, 4), st.sampled_from(["l40s", "l4", "h100-pcie", "a100-pcie-80gb"]))
def test_pilots_hold_the_gpus_in_one_server(gpus: int, cand: str) -> None:
    best = plan(load_spec({"candidates": [cand], "workloads": [{"kind": "gpus", "gpus": gpus}]}))
    b = best.best
    assert b and b.servers == 1 and gpus <= b.gpus <= 4 and b.gpus < 2 * gpus + 1
    assert b.fabric and b.fabric.compute.switches == 0


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(1e3, 1e9), st.floats(0.5, 15), st.floats(0.5, 10), st.floats(0, 90))
def test_hardware_cost_brackets(
    capex: float, horizon: float, period: float, residual: float
) -> None:
    purchases, per_year, book, hardware = hardware_over_horizon(capex, horizon, period, residual)
    assert purchases >= horizon / period - 1e-9
    assert capex * residual / 100 - 1e-6 * capex <= book <= capex + 1e-6
    # at least the value used up over the horizon, at most every purchase paid in full
    assert hardware >= per_year * min(horizon, period) - 1e-6 * capex
    assert hardware <= purchases * capex + 1e-6


@settings(max_examples=examples(100), deadline=None)
@given(
    st.floats(1, 50_000),
    st.floats(1.0, 2.0),
    st.sampled_from(["N", "N+1", "2N"]),
    st.sampled_from(["air", "liquid"]),
    st.floats(0, 1),
)
def test_plant_covers_the_load(it: float, pue: float, red: str, cooling: str, frac: float) -> None:
    p = plant(it_kw=it, facility_kw=it * pue, redundancy=red, cooling=cooling, liquid_fraction=frac)
    assert p.ups_installed_kva * 0.9 >= it - 1e-6
    spare = {"N": 0, "N+1": 1, "2N": 0}[red]
    units = p.generators if red != "2N" else p.generators // 2
    assert (units - spare) * 2000 / 0.8 >= p.generator_kva - 1e-6
    if p.liquid_kw:
        assert (p.cdus - 1) * 1000 >= p.liquid_kw - 1e-6
    assert abs(p.liquid_kw + p.air_kw - it) < 1e-6 * it


@settings(max_examples=examples(20), deadline=None)
@given(st.integers(1, 3), st.integers(0, 4))
def test_tiny_sites_cable_every_bmc(servers: int, mgmt: int) -> None:
    layout = Layout(1, 4, 12, 0.6, 2.4)
    f = fabric(servers, layout, pdus=2, compute_nics=4, storage_nics=1, management_nodes=mgmt)
    cables = cable_map(f, layout, 2)
    oob = [c for c in cables if c.network == "out-of-band"]
    assert len(oob) == f.oob_links == servers + mgmt + 2 + f.data_switches
    if servers == 1:
        assert f.data_switches == 0  # one node uplinks to the site network
