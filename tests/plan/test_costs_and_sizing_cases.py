"""Issue 17 planner cases against hand-computed values: TCO with staff, refresh and residual value,
budget overrun as a warning, tensor parallel vs attention heads, HPC FP64/FP32 sizing, 1-4 GPU
pilots and inference cost per million tokens (formulas and sources in docs/plan.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from gpufleet.errors import ConfigError
from gpufleet.plan.compute import tp_divides_heads
from gpufleet.plan.cost import cost_per_million_tokens, hardware_over_horizon
from gpufleet.plan.facility import ImpossibleConstraint
from gpufleet.plan.planner import plan
from gpufleet.plan.spec import load_spec
from tests.plan.builders import cost

H100_USABLE = 85_520_809_984 * 0.9  # catalog NVML size x (1 - default headroom 0.10)


def test_straight_line_refresh_and_residual() -> None:
    # capex 1 M, refresh every 3 years to 10 % residual, horizon 5 years:
    # 900,000 / 3 = 300,000 a year; bought twice (years 0 and 3); the second fleet is 2 years
    # old at the horizon: book 1,000,000 - 600,000 = 400,000; hardware 2,000,000 - 400,000.
    assert hardware_over_horizon(1e6, 5, 3, 10) == (2, 300_000, 400_000, 1_600_000)
    # horizon = refresh period: one purchase, worth exactly its residual at the end
    purchases, per_year, book, hardware = hardware_over_horizon(1e6, 4, 4, 20)
    assert (purchases, per_year, hardware) == (1, 200_000, 800_000)
    assert book == pytest.approx(200_000)
    # defaults (period = horizon, no residual): the whole capex, as before
    assert hardware_over_horizon(1e6, 4, 4, 0) == (1, 250_000, 0, 1e6)


def test_tco_adds_staff_and_credits_residual() -> None:
    c = cost(staff_fte=2, staff_cost_per_fte=150_000.0, depreciation_years=3, residual_percent=10)
    # energy 10 kW x 8760 h x 0.1 = 8,760; staff 2 x 150,000 = 300,000
    assert c.staff_per_year == 300_000
    assert c.opex_per_year == pytest.approx(308_760)
    assert c.tco == pytest.approx(1_600_000 + 5 * 308_760)
    assert c.purchases == 2 and c.residual_value == pytest.approx(400_000)


def test_budget_overrun_is_a_warning_not_a_note() -> None:
    c = cost(budget=900_000.0)
    assert c.warnings == ("capex 1,000,000 USD exceeds the budget 900,000 USD by 100,000 USD",)
    assert not any("budget" in n for n in c.notes)
    assert cost(budget=1_000_000.0).warnings == ()


def test_staff_needs_a_cost() -> None:
    with pytest.raises(ConfigError, match="staff_cost_per_fte"):
        load_spec(
            {
                "candidates": ["h100"],
                "workloads": [{"kind": "gpus", "gpus": 8}],
                "prices": {"staff_fte": 2},
            }
        )


def test_cost_per_million_tokens() -> None:
    # 1 M USD over 1 year at 10,000 tokens/s all the time: 3.1536e11 tokens -> 3.171 $/M
    assert cost_per_million_tokens(1e6, 1e4, 1, 1.0) == pytest.approx(1e12 / 3.1536e11)
    assert cost_per_million_tokens(1e6, 1e4, 1, 1.0) == pytest.approx(3.1710, abs=1e-4)


def test_plan_reports_cost_per_million_tokens_next_to_tokens_per_joule() -> None:
    spec = load_spec(
        {
            "horizon_years": 3,
            "candidates": ["h200-sxm"],
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"layers": 80, "hidden_size": 8192, "heads": 64, "kv_heads": 8},
                    "context_length": 8192,
                    "concurrent_sequences": 256,
                    "target_tokens_per_s": 10000,
                }
            ],
            "prices": {"server": "400000 USD", "energy": "0.10 USD/kWh", "utilization": 0.5},
        }
    )
    best = plan(spec).best
    assert best and best.cost and best.cost.tco and best.tokens_per_joule
    tok = best.workloads[0].inference.decode_tokens_per_s  # type: ignore[union-attr]
    expected = best.cost.tco / (tok * 8760 * 3600 * 3 * 0.5) * 1e6
    assert best.cost_per_million_tokens == pytest.approx(expected)


def test_tp_divides_heads_and_kv_heads() -> None:
    assert tp_divides_heads(8, 64, 8)
    assert not tp_divides_heads(3, 64, 8)  # 64 / 3
    assert not tp_divides_heads(16, 64, 8)  # Megatron: kv_heads 8 not divisible by 16
    assert tp_divides_heads(16, 64, 8, serving=True)  # vLLM replicates each KV head twice
    assert not tp_divides_heads(6, 96, 8, serving=True)  # 8 % 6 and 6 % 8


def _training(model: Mapping[str, object], tp: object = "auto") -> dict[str, object]:
    return {
        "candidates": ["h100-sxm"],
        "workloads": [
            {
                "kind": "training",
                "model": model,
                "sequence_length": 4096,
                "global_batch": 256,
                "tokens": 1e11,
                "tensor_parallel": tp,
                "gpus": 64,
            }
        ],
    }


def test_explicit_tp_not_dividing_heads_is_refused_with_the_field() -> None:
    model = {"layers": 32, "hidden_size": 5120, "heads": 40, "kv_heads": 8}
    with pytest.raises(ConfigError) as exc:
        plan(load_spec(_training(model, 16)))
    assert "workloads[0].tensor_parallel: 16 does not divide the 40 attention heads" in str(
        exc.value
    )
    assert exc.value.exit_code == 2


def test_auto_tp_only_picks_divisors_of_heads() -> None:
    # 20 heads of 128, kv 20: tp 8 would split heads unevenly, so auto stops at 4
    model = {"layers": 60, "hidden_size": 2560, "heads": 20, "kv_heads": 20}
    best = plan(load_spec(_training(model))).best
    assert best and best.workloads[0].training
    assert best.workloads[0].training.memory.tensor_parallel in (1, 2, 4)


def test_parameter_count_only_says_tp_could_not_be_checked() -> None:
    best = plan(load_spec(_training({"parameters": 13e9}, 8))).best
    assert best
    assert any("tensor_parallel 8 could not be checked" in n for n in best.notes)


def _hpc(cands: list[str], **w: object) -> dict[str, object]:
    return {"candidates": cands, "workloads": [{"kind": "hpc", **w}]}


def test_fp64_sized_by_sustained_rate() -> None:
    # H100 SXM FP64 tensor 67 TFLOP/s (datasheet) x 0.6 = 40.2; 1,000 / 40.2 = 24.9 -> 25 GPUs
    # -> 32 in whole 8-GPU servers
    best = plan(load_spec(_hpc(["h100-sxm"], precision="fp64", sustained_tflops=1000))).best
    assert best and best.workloads[0].hpc
    h = best.workloads[0].hpc
    assert (h.peak_path, h.peak_tflops, h.gpus_by_rate, h.gpus) == ("fp64_tensor", 67, 25, 32)
    assert h.sustained_tflops == pytest.approx(32 * 40.2)
    # vector FP64 (no DGEMM on tensor cores): 34 x 0.6 = 20.4 -> 49.02 -> 50 -> 56
    vec = plan(
        load_spec(_hpc(["h100-sxm"], precision="fp64", tensor_cores=False, sustained_tflops=1000))
    ).best
    assert vec and vec.workloads[0].hpc and vec.workloads[0].hpc.gpus == 56


def test_fp64_flop_budget_with_deadline() -> None:
    # 1e21 FLOP in 1 day = 11,574 TFLOP/s; / 40.2 = 287.9 -> 288 GPUs (36 servers)
    best = plan(load_spec(_hpc(["h100-sxm"], flops=1e21, target_days=1))).best
    assert best and best.workloads[0].hpc
    assert best.workloads[0].hpc.gpus_by_rate == 288 == best.gpus
    assert best.workloads[0].hpc.days == pytest.approx(1e21 / (288 * 40.2e12) / 86400)


def test_fp64_memory_per_precision_bounds_the_count() -> None:
    # 1e12 fp64 values x 8 bytes = 8e12 B / 76.97e9 usable per H100 = 103.9 -> 104 GPUs
    best = plan(load_spec(_hpc(["h100-sxm"], values=1e12, sustained_tflops=100))).best
    h = best.workloads[0].hpc if best else None
    assert h and h.working_set_bytes == 8e12
    assert h.gpus_by_memory == math.ceil(8e12 / H100_USABLE) == 104
    assert h.gpus == 104 and h.bound == "memory"
    # the same problem at fp32 holds half the bytes: 52 GPUs
    best32 = plan(
        load_spec(_hpc(["h100-sxm"], precision="fp32", values=1e12, sustained_tflops=100))
    ).best
    assert best32 and best32.workloads[0].hpc and best32.workloads[0].hpc.gpus_by_memory == 52


def test_fp32_rendering_on_l40s_and_fp64_refused_there() -> None:
    # L40S FP32 91.6 TFLOP/s x 0.6 = 54.96; 500 / 54.96 = 9.1 -> 10 GPUs -> 16 (8-GPU servers)
    spec = _hpc(["l40s"], name="render", precision="fp32", tensor_cores=False, sustained_tflops=500)
    best = plan(load_spec(spec)).best
    assert best and best.workloads[0].hpc and best.workloads[0].hpc.gpus_by_rate == 10
    assert best.gpus == 16
    with pytest.raises(ImpossibleConstraint, match="no fp64 peak"):
        plan(load_spec(_hpc(["l40s"], precision="fp64", sustained_tflops=100)))
    # with an FP64 candidate beside it the L40S is only infeasible, and the other is chosen
    two = plan(load_spec(_hpc(["l40s", "h100-sxm"], sustained_tflops=100)))
    assert two.chosen == "h100-sxm"
    assert not next(c for c in two.candidates if c.candidate == "l40s").feasible


def _pilot(cand: str, gpus: int, **c: object) -> dict[str, object]:
    return {
        "candidates": [cand],
        "workloads": [{"kind": "gpus", "gpus": gpus}],
        "constraints": dict(c),
    }


@pytest.mark.parametrize(("gpus", "size"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_pcie_pilot_of_1_to_4_gpus(gpus: int, size: int) -> None:
    best = plan(load_spec(_pilot("l40s", gpus))).best
    assert best and best.facility and best.fabric
    assert (best.gpus, best.servers, best.server.gpus) == (size, 1, size)
    # L40S 350 W (datasheet) per GPU + 1 kW stated pilot host overhead
    assert best.server.power_kw == pytest.approx((size * 350 + 1000) / 1000)
    assert best.server.rack_units == 2
    assert best.fabric.compute.levels == 0  # one node: no east-west fabric
    assert best.facility.racks == 1


def test_explicit_gpus_per_server_and_sxm_pilot_note() -> None:
    best = plan(load_spec(_pilot("h100-pcie", 8, gpus_per_server=2, rack_power="20 kW"))).best
    assert best and (best.servers, best.server.gpus) == (4, 2)
    assert best.server.power_kw == pytest.approx((2 * 350 + 1000) / 1000)  # H100 PCIe 350 W
    sxm = plan(load_spec(_pilot("h100-sxm", 2, rack_power="20 kW"))).best
    assert sxm and sxm.gpus == 8
    assert any("buys a whole 8-GPU server" in n for n in sxm.notes)


def test_hpc_workload_in_the_html_report() -> None:
    from gpufleet.plan.report_html import render_html

    page = render_html(plan(load_spec(_hpc(["h100-sxm"], name="cfd", sustained_tflops=1000))))
    # 32 GPUs x 67 x 0.6 = 1,286 TFLOP/s sustained
    assert "hpc (fp64)" in page and "1,286 TFLOP/s sustained" in page
