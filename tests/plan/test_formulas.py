"""Each planner formula against hand-computed values (sources in docs/plan.md)."""

from __future__ import annotations

import math

import pytest

from gpufleet.plan.compute import gpus_for_deadline, train_flops, training_seconds
from gpufleet.plan.facility import ImpossibleConstraint, circuit_kw, circuits_per_rack
from gpufleet.plan.memory import (
    activation_bytes_per_layer,
    count_parameters,
    kv_cache_bytes,
    model_state_bytes,
)
from gpufleet.plan.spec import ModelShape
from tests.plan.builders import cost, facility, storage


def test_adam_states_16_bytes_per_param_divided_by_zero_stage() -> None:
    n = 1e9
    assert model_state_bytes(n, zero_stage=0, tp=1, pp=1, dp=8) == 16e9
    # stage 1: 2 + 2 + 12/8 = 5.5 bytes/param
    assert model_state_bytes(n, zero_stage=1, tp=1, pp=1, dp=8) == pytest.approx(5.5e9)
    # stage 2: 2 + 2/8 + 12/8 = 3.75
    assert model_state_bytes(n, zero_stage=2, tp=1, pp=1, dp=8) == pytest.approx(3.75e9)
    # stage 3: 16/8 = 2; and tp x pp = 4 divides again
    assert model_state_bytes(n, zero_stage=3, tp=2, pp=2, dp=8) == pytest.approx(0.5e9)


def test_korthikanti_activation_formulas() -> None:
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B shape
    sbh = s * b * h
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a) == sbh * (34 + 5 * 96 * 2048 / 12288)
    # = 25,165,824 x 114 = 2,868,903,936 bytes
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a) == 2_868_903_936
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a, t=8) == pytest.approx(
        sbh * (10 + 3 + 80 / 8)
    )
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a, t=8, sequence_parallel=True) == (
        pytest.approx(sbh / 8 * 114)
    )
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a, t=8, recompute="selective") == (
        pytest.approx(34 * sbh / 8)
    )
    assert activation_bytes_per_layer(s=s, b=b, h=h, a=a, t=8, recompute="full") == 2 * sbh


def test_kv_cache_llama_70b_8k_fp16() -> None:
    # 2 x 80 layers x 8 kv heads x 128 dims x 2 bytes = 327,680 bytes/token; x 8192 = 2.5 GiB
    b = kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, bytes_per_value=2, tokens=8192)
    assert b == 327_680 * 8192 == 2.5 * 2**30


def test_parameter_count_gpt3_and_llama3_70b() -> None:
    gpt3 = ModelShape(layers=96, hidden_size=12288, heads=96, vocab_size=50257)
    # 12 L h^2 + V h = 173,946,175,488 + 617,607,216
    assert count_parameters(gpt3) == 12 * 96 * 12288**2 + 50257 * 12288
    llama = ModelShape(
        layers=80,
        hidden_size=8192,
        heads=64,
        kv_heads=8,
        vocab_size=128256,
        ffn_hidden_size=28672,
        gated_mlp=True,
        tied_embeddings=False,
    )
    assert count_parameters(llama) / 1e9 == pytest.approx(70.55, abs=0.01)  # Meta: "70B"


def test_six_n_d_and_training_time() -> None:
    f = train_flops(70e9, 2e12)
    assert f == 8.4e23
    # 1024 GPUs x 989.5e12 x 0.4 = 4.05299e17 FLOP/s -> 2.0725e6 s = 23.99 days
    days = training_seconds(f, 1024, 989.5, 0.4) / 86400
    assert days == pytest.approx(8.4e23 / (1024 * 989.5e12 * 0.4) / 86400)
    assert days == pytest.approx(23.99, abs=0.01)
    assert gpus_for_deadline(f, 24 * 86400, 989.5, 0.4) == 1024


def test_circuit_capacity_with_nec_derating() -> None:
    # 208 V x 30 A x 0.8 x sqrt(3) = 8.646 kW; single phase 240 V x 30 A x 0.8 = 5.76 kW
    assert circuit_kw(208, 30, 3) == pytest.approx(8.6461, abs=1e-3)
    assert circuit_kw(240, 30, 1) == pytest.approx(5.76)
    assert circuits_per_rack(30.6, 17.29, "N") == 2
    assert circuits_per_rack(30.6, 17.29, "N+1") == 3
    assert circuits_per_rack(30.6, 17.29, "2N") == 4


def test_facility_racks_power_cooling() -> None:
    f = facility()
    assert f.servers_per_rack == 2  # floor(40 / 14.3)
    assert f.racks == 64
    assert f.it_kw == pytest.approx(128 * 14.3)  # 1830.4 kW
    assert f.facility_kw == pytest.approx(1830.4 * 1.15)
    assert f.heat_load_tons == pytest.approx(1830.4 / 3.517)
    # 415 V x 60 A x 0.8 x sqrt(3) = 34.5 kW >= 28.6 kW: one circuit, two with 2N
    assert f.circuits_per_rack == 2 and f.pdus == 128
    assert f.annual_mwh == pytest.approx(1830.4 * 1.15 * 8760 / 1000)


def test_rack_limit_below_one_server_is_explained() -> None:
    with pytest.raises(ImpossibleConstraint) as exc:
        facility(rack_limit_kw=8.0, server_kw=10.2, server_name="NVIDIA DGX H100")
    assert "rack limit 8 kW is below one NVIDIA DGX H100 at 10.2 kW" in str(exc.value)
    assert exc.value.hint and "rack_power" in exc.value.hint


def test_racks_available_exceeded() -> None:
    with pytest.raises(ImpossibleConstraint, match="need 64 racks"):
        facility(racks_available=10)


def test_cost_tco_and_breakeven() -> None:
    c = cost(
        server_price=300_000.0,
        support_per_year=10_000.0,
        space_per_rack_month=1000.0,
        cloud_per_gpu_hour=3.0,
        horizon_years=4,
    )
    assert c.energy_per_year == pytest.approx(8760.0)  # 10 kW x 8760 h x 0.1 $/kWh
    assert c.opex_per_year == pytest.approx(8760 + 10_000 + 12_000)
    assert c.tco == pytest.approx(300_000 + 4 * 30_760)
    assert c.tco is not None
    assert c.cost_per_gpu_hour == pytest.approx(c.tco / (8 * 8760 * 4))
    # cloud: 8 x 730 h x 3 $ = 17,520 $/month; saving 17,520 - 2,563.33 = 14,956.67 -> month 21
    assert c.cloud_per_month == pytest.approx(17_520)
    assert c.breakeven_month == math.ceil(300_000 / (17_520 - 30_760 / 12)) == 21


def test_checkpoint_and_bandwidth() -> None:
    s = storage()
    assert s.checkpoint_bytes == 70e9 * 14  # 980 GB
    assert s.checkpoint_write_bytes_per_s == pytest.approx(980e9 / 300)
    assert s.dataset_read_bytes_per_s == 4e6
    assert s.local_nvme_needed_bytes_per_node == pytest.approx(2 * 980e9 / 128)
