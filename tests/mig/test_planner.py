"""The exact planner against hand-worked packings, the first-fit baseline, re-planning."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import UnknownNameError, UsageError
from gpufleet.mig.demand import parse_demand, parse_mix
from gpufleet.mig.fleet import load_current, parse_gpus
from gpufleet.mig.planner import plan_exact, plan_first_fit, plan_mix


def test_two_gpus_suffice_for_12_compute_slices() -> None:
    # 6x1g (6 compute) + 2x3g (6 compute) = 12 > 7, so at least 2 GPUs; 2 do it:
    # GPU A 3g@4 + 4x1g@0..3, GPU B 3g@4 + 2x1g.
    plan = plan_exact(
        parse_gpus("8xh200"), parse_demand("team-a: 6 x 1g.18gb, team-b: 2 x 3g.71gb")
    )
    assert plan.optimal
    assert plan.placed == {"team-a": {"1g.18gb": 6}, "team-b": {"3g.71gb": 2}}
    assert plan.unplaced == {}
    assert plan.gpus_used == 2
    assert plan.placed_compute_slices == 12


def test_exact_beats_first_fit_on_placement_order() -> None:
    # first-fit puts the 1g at slice 0, and 4g.71gb can only start at 0: it needs a second
    # GPU. The exact plan puts 4g@0 and 1g@4 on one GPU.
    gpus = parse_gpus("2xh200")
    demand = parse_demand("a: 1 x 1g.18gb, b: 1 x 4g.71gb")
    ff = plan_first_fit(gpus, demand)
    ex = plan_exact(gpus, demand)
    assert ff.gpus_used == 2
    assert ex.gpus_used == 1
    assert ex.placed_instances == ff.placed_instances == 2


def test_first_fit_loses_demand_the_exact_plan_places() -> None:
    gpus = parse_gpus("1xh200")
    demand = parse_demand("a: 1 x 1g.18gb, b: 1 x 4g.71gb, c: 1 x 3g.71gb")
    ff = plan_first_fit(gpus, demand)
    ex = plan_exact(gpus, demand)
    # first-fit: 1g@0, 4g cannot start at 0 -> unplaced, 3g@4 (4 compute used)
    assert ff.unplaced == {"b": {"4g.71gb": 1}}
    # exact: 4g@0 + 3g@4 = 7 compute beats 1g + 3g = 4; the 1g is left out
    assert ex.unplaced == {"a": {"1g.18gb": 1}}
    assert ex.placed_compute_slices == 7


def test_capacity_limits_and_unplaced() -> None:
    plan = plan_exact(parse_gpus("1xh200"), parse_demand("a: 2 x 4g.71gb"))
    assert plan.placed == {"a": {"4g.71gb": 1}}
    assert plan.unplaced == {"a": {"4g.71gb": 1}}


def test_round_robin_between_tenants() -> None:
    plan = plan_exact(parse_gpus("1xh200"), parse_demand("a: 7 x 1g.18gb, b: 7 x 1g.18gb"))
    assert plan.placed == {"a": {"1g.18gb": 4}, "b": {"1g.18gb": 3}}
    assert plan.memory_slices_stranded == 1


def test_mixed_models_route_profiles() -> None:
    gpus = parse_gpus("2xh100,2xh200")
    plan = plan_exact(gpus, parse_demand("a: 2 x 3g.40gb, b: 2 x 3g.71gb"))
    assert plan.unplaced == {}
    models = {r.gpu.model for r in plan.gpus if not r.layout.empty}
    assert models == {"h100-sxm", "h200-sxm"}
    assert plan.gpus_used == 2


def test_unknown_profile_for_fleet() -> None:
    with pytest.raises(UnknownNameError):
        plan_exact(parse_gpus("1xh100"), parse_demand("a: 1 x 3g.71gb"))


def test_model_without_mig_is_a_clear_error() -> None:
    with pytest.raises(UsageError):
        plan_exact(parse_gpus("1xl40s"), parse_demand("a: 1 x 1g.10gb"))


def test_target_mix_scales_to_largest_multiple() -> None:
    # k x (3g + 1g): k=3 fits (GPU A 2x3g, GPU B 3g@0 + 1g@4,5,6); k=4 needs 4x3g = both
    # GPUs full of 3g, no room for a 1g.
    plan = plan_mix(parse_gpus("2xh200"), parse_mix("3g.71gb:1, 1g.18gb:1"))
    assert plan.placed == {"mix": {"3g.71gb": 3, "1g.18gb": 3}}
    assert plan.unplaced == {}


def _current(tmp_path: Path, gpus: str) -> Path:
    f = tmp_path / "layout.yaml"
    f.write_text(f"nodes:\n  - name: node-0\n    model: h200\n    gpus: {gpus}\n")
    return f


def test_replan_keeps_layouts_that_still_fit(tmp_path: Path) -> None:
    gpus = load_current(_current(tmp_path, "[{3g.71gb: 2}, {1g.18gb: 7}, {}]"))
    plan = plan_exact(gpus, parse_demand("a: 2 x 3g.71gb, b: 5 x 1g.18gb"))
    assert plan.unplaced == {}
    assert plan.gpus_repartitioned == 0
    assert plan.gpus_used == 2


def test_replan_repartitions_one_gpu(tmp_path: Path) -> None:
    gpus = load_current(_current(tmp_path, "[{3g.71gb: 2}, {1g.18gb: 7}]"))
    plan = plan_exact(gpus, parse_demand("a: 2 x 3g.71gb, b: 1 x 4g.71gb"))
    assert plan.unplaced == {}
    assert plan.gpus_repartitioned == 1
    kept = [r for r in plan.gpus if not r.repartition]
    assert [r.layout.counts for r in kept] == [{"3g.71gb": 2}]


def test_current_file_errors(tmp_path: Path) -> None:
    from gpufleet.errors import ConfigError

    with pytest.raises(ConfigError, match=r"gpus\[0\].*not a valid MIG layout"):
        load_current(_current(tmp_path, "[{4g.71gb: 2}]"))


def test_thousand_gpu_fleet_plans() -> None:
    plan = plan_exact(parse_gpus("125x8xh100"), parse_demand("a: 3000 x 1g.10gb, b: 900 x 3g.40gb"))
    # Patterns: x GPUs of 3g+4x1g (memory full), y of 7x1g, z of 2x3g. Minimise x+y+z with
    # x+2z >= 900, 4x+7y >= 3000: total = 878.6 - x/14, so x as large as y >= 0 allows:
    # x=750, y=0, z=75 -> 825 GPUs (integral, so optimal).
    assert plan.unplaced == {}
    assert plan.gpus_used == 825
