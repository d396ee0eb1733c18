"""Spec validation (field paths, did-you-mean, units) and whole plans, including the SuperPOD."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError, ParseError, UnknownNameError
from gpufleet.plan.facility import ImpossibleConstraint
from gpufleet.plan.planner import plan
from gpufleet.plan.spec import load_spec
from gpufleet.plan.units import UnitProblem, parse_quantity

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, object] = {"candidates": ["h100-sxm"], "workloads": [{"kind": "gpus", "gpus": 8}]}


def test_units_convert_and_refuse_wrong_dimension() -> None:
    assert parse_quantity("40 kW", "power") == 40_000
    assert parse_quantity("0.08 USD/kWh", "energy_price") == pytest.approx(0.08)
    assert parse_quantity("80 USD/MWh", "energy_price") == pytest.approx(0.08)
    assert parse_quantity("2.5 USD/GPU/hour", "hourly_price") == 2.5
    assert parse_quantity("5 min", "time") == 300
    assert parse_quantity("30 TB", "size") == 30e12
    with pytest.raises(UnitProblem, match="is not a power"):
        parse_quantity("40 kV", "power")
    with pytest.raises(UnitProblem, match="has no unit"):
        parse_quantity(40, "power")


@pytest.mark.parametrize(
    ("patch", "path", "text"),
    [
        (
            {"constraints": {"rack_power": "40 kV"}},
            "constraints.rack_power",
            "'40 kV' is not a power",
        ),
        (
            {"constraints": {"rack_powr": "40 kW"}},
            "constraints.rack_powr",
            "did you mean 'rack_power'",
        ),
        (
            {"constraints": {"circuit": {"current": "30 V"}}},
            "constraints.circuit.current",
            "is not a current",
        ),
        ({"prices": {"energy": "0.08 USD"}}, "prices.energy", "is not an energy price"),
        ({"workloads": [{"kind": "trainig"}]}, "workloads[0]", "kind must be one of"),
        ({"horizon_years": 0}, "horizon_years", "greater than 0"),
    ],
)
def test_bad_spec_names_the_field(patch: dict[str, object], path: str, text: str) -> None:
    with pytest.raises(ParseError) as exc:
        load_spec({**BASE, **patch}, "spec.yaml")
    assert exc.value.where == path
    assert text in str(exc.value)


def test_bad_yaml_names_the_line() -> None:
    with pytest.raises(ParseError, match="line 3"):
        load_spec("name: x\ncandidates:\n\t- h100\n", "spec.yaml")  # a tab on line 3


def test_unknown_model_suggests() -> None:
    with pytest.raises(UnknownNameError) as exc:
        plan(load_spec({**BASE, "candidates": ["h100-sxm", "h10-sxm"]}))
    assert "candidates[1]" in str(exc.value)
    assert "h100-sxm" in exc.value.suggestions


def test_unknown_price_key_suggests_candidate() -> None:
    with pytest.raises(ConfigError, match=r"prices\.server\.h10-sxm"):
        plan(load_spec({**BASE, "prices": {"server": {"h10-sxm": "1 USD"}}}))


def test_rack_limit_below_server_is_explained() -> None:
    with pytest.raises(ImpossibleConstraint) as exc:
        plan(load_spec({**BASE, "constraints": {"rack_power": "8 kW"}}))
    assert "rack limit 8 kW is below one NVIDIA DGX H100 at 10.2 kW" in str(exc.value)


def test_uses_catalog_system_power_not_tdp() -> None:
    best = plan(load_spec({**BASE, "constraints": {"rack_power": "40 kW"}})).best
    assert best and best.facility
    assert best.server.key == "dgx-h100"
    assert best.facility.it_kw == pytest.approx(10.2 + 0.0 + 1.5 * best.fabric.data_switches)  # type: ignore[union-attr]


@pytest.mark.parametrize(("gpus", "leaf", "spine"), [(512, 16, 8), (1024, 32, 16), (2048, 64, 32)])
def test_superpod_b200_through_the_planner(gpus: int, leaf: int, spine: int) -> None:
    spec = load_spec(
        {
            "candidates": ["dgx-b200"],
            "workloads": [{"kind": "gpus", "gpus": gpus}],
            "constraints": {"rack_power": "60 kW", "cooling": "liquid"},
        }
    )
    best = plan(spec).best
    assert best and best.fabric and best.facility
    assert best.servers == gpus // 8
    t = best.fabric.compute
    assert (t.leaves, t.spines, t.endpoint_links, t.leaf_spine_links) == (leaf, spine, gpus, gpus)
    assert best.server.power_kw == 14.3  # DGX B200 datasheet


def test_training_sized_by_deadline_and_memory() -> None:
    spec = load_spec(
        {
            **BASE,
            "workloads": [
                {
                    "kind": "training",
                    "model": {"parameters": 7e9},
                    "sequence_length": 4096,
                    "global_batch": 1024,
                    "tokens": 1e12,
                    "target_days": 10,
                }
            ],
        }
    )
    best = plan(spec).best
    assert best and best.workloads[0].training
    tr = best.workloads[0].training
    # 6 x 7e9 x 1e12 = 4.2e22 FLOPs / (10 d x 86400 s x 989.5e12 x 0.4) = 122.8 -> 123 GPUs
    assert tr.gpus_by_deadline == 123
    assert tr.gpus == 128  # whole 8-GPU servers
    assert tr.days <= 10
    assert tr.memory.fits


def test_model_too_big_for_any_layout_is_infeasible() -> None:
    spec = load_spec(
        {
            **BASE,
            "workloads": [
                {
                    "kind": "training",
                    "model": {"layers": 4, "hidden_size": 65536, "heads": 512},
                    "sequence_length": 2048,
                    "global_batch": 8,
                    "tokens": 1e9,
                    "zero_stage": 0,
                    "tensor_parallel": 1,
                    "pipeline_parallel": 1,
                }
            ],
        }
    )
    with pytest.raises(ImpossibleConstraint, match="does not fit"):
        plan(spec)


def test_generic_server_for_gpu_without_system() -> None:
    from gpufleet.catalog import load_catalog

    cat = load_catalog()
    lonely = next((g for g in cat.gpus if not cat.systems_for(g)), None)
    if lonely is None:
        pytest.fail("catalog has a system for every GPU; this test needs one without")
    best = plan(
        load_spec({**BASE, "candidates": [lonely], "constraints": {"rack_power": "100 kW"}})
    ).best
    gpu = cat.gpus[lonely]
    assert best and best.server.generic
    assert best.server.power_kw == pytest.approx((8 * gpu.max_power_w + 3000) / 1000)
    assert any("host overhead" in n for n in best.notes)


@pytest.mark.parametrize("name", ["pilot-8gpu.yaml", "training-1024.yaml", "inference-fleet.yaml"])
def test_examples_plan(name: str) -> None:
    text = (ROOT / "examples" / name).read_text()
    result = plan(load_spec(text, name))
    assert result.best is not None and result.best.feasible
    if name == "pilot-8gpu.yaml":
        assert result.best.gpus == 8
    if name == "training-1024.yaml":
        assert result.best.gpus == 1024
