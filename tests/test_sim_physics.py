"""The simulator's physics against the real H200 trace: idle -> 25 s bf16 burn -> cooldown,
read through the production NVML backend."""

from __future__ import annotations

import itertools
import json

import pytest

from gpufleet.devices.sim import Load, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.types import ClockEventReason
from tests.conftest import H200


def _fleet(spec: str = "1x1xh200-sxm") -> tuple[SimFleet, ManualClock]:
    clock = ManualClock()
    return SimFleet(parse_fleet_spec(spec), clock=clock), clock


def test_idle_burn_cooldown_matches_the_h200_trace() -> None:
    fleet, clock = _fleet()
    node = fleet.node("sim-00")
    backend = node.backend()
    gpu = node.gpus[0]
    dt = 0.1
    trace = []
    # 5 s idle
    for _ in range(50):
        clock.advance(dt)
        trace.append(("idle", backend.sample_fast(0), backend.sample_slow(0)))
    gpu.run(Load(), duration_s=25.0)
    for _ in range(250):
        clock.advance(dt)
        trace.append(("burn", backend.sample_fast(0), backend.sample_slow(0)))
    for _ in range(100):
        clock.advance(dt)
        trace.append(("cool", backend.sample_fast(0), backend.sample_slow(0)))

    idle = [f for ph, f, _ in trace if ph == "idle"]
    assert all(abs((s.power_w or 0) - 79) <= 5 for s in idle)
    assert all(s.sm_clock_mhz == 345 for s in idle)
    assert all((s.clock_event_reasons or 0) & ClockEventReason.GPU_IDLE for s in idle)

    burn = [f for ph, f, _ in trace if ph == "burn"]
    settled = burn[30:]  # after 3 s
    for s in settled:
        assert s.power_w is not None and abs(s.power_w - 700) <= 0.03 * 700
        assert (s.clock_event_reasons or 0) & ClockEventReason.SW_POWER_CAP
        assert s.sm_clock_mhz is not None and 1400 <= s.sm_clock_mhz <= 1550
    plateau = [s.gpu_temp_c for s in burn[-50:]]
    assert all(t is not None and abs(t - 62) <= 4 for t in plateau)
    # a lag, not a step: 0.1 s into the burn the GPU is still far below the plateau
    first = burn[0].gpu_temp_c
    assert first is not None and first < 50
    temps = [s.gpu_temp_c or 0 for s in burn[:20]]
    assert temps == sorted(temps) and temps[-1] > temps[0]

    # energy counter equals integrated power within 1 %
    e0 = trace[0][2].energy_mj
    e1 = trace[-1][2].energy_mj
    assert e0 is not None and e1 is not None
    powers = [f.power_w or 0 for _, f, _ in trace]
    integrated_mj = sum((a + b) / 2 * dt * 1000 for a, b in itertools.pairwise(powers))
    assert abs((e1 - e0) - integrated_mj) <= 0.01 * integrated_mj

    cool = [f for ph, f, _ in trace if ph == "cool"]
    assert cool[-1].gpu_temp_c is not None and cool[-1].gpu_temp_c < 45
    assert not ((cool[-1].clock_event_reasons or 0) & ClockEventReason.SW_POWER_CAP)


def test_burn_plateau_agrees_with_recorded_trace_averages() -> None:
    """Compare the simulated burn with the recorded one sample for sample (averages)."""
    doc = json.loads((H200 / "load_trace.json").read_text())
    rec = [r for r in doc["trace"] if r["phase"] == "burn" and r["util"] >= 99]
    rec_power = sum(r["power_mw"] for r in rec) / len(rec) / 1000
    rec_clock = sum(r["sm_mhz"] for r in rec) / len(rec)
    fleet, clock = _fleet()
    node = fleet.node("sim-00")
    backend = node.backend()
    node.gpus[0].run(Load())
    clock.advance(5)
    samples = []
    for _ in range(100):
        clock.advance(0.1)
        samples.append(backend.sample_fast(0))
    sim_power = sum(s.power_w or 0 for s in samples) / len(samples)
    sim_clock = sum(s.sm_clock_mhz or 0 for s in samples) / len(samples)
    assert sim_power == pytest.approx(rec_power, rel=0.02)
    assert sim_clock == pytest.approx(rec_clock, rel=0.03)


def test_light_load_runs_at_max_clock_below_the_cap() -> None:
    fleet, clock = _fleet("1x1xh100")
    node = fleet.node("sim-00")
    node.gpus[0].run(Load(util=0.3, intensity=0.3))
    clock.advance(10)
    s = node.backend().sample_fast(0)
    assert s.sm_clock_mhz == 1980
    assert s.power_w is not None and s.power_w < 400
    assert not (s.clock_event_reasons or 0) & ClockEventReason.SW_POWER_CAP
