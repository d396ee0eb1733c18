"""Locked SM clocks, the power tuner's second knob, on the simulator (it speaks NVML, with the
driver's return codes): the DVFS model against the H200 fixture, the knob comparison derived by
hand, clocks always reset (after the sweep, an error, a crash: agent start)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.cli.app import app
from gpufleet.devices.sim import Load, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.sim.nvml_api import SimNvml
from gpufleet.energy.advise import advise, compare_knobs
from gpufleet.energy.clocks import (
    lock_clocks,
    read_clock_state,
    recover_locked_clocks,
    sweep_clocks,
)
from gpufleet.energy.sweep import sweep
from gpufleet.energy.workloads import RunResult, SimRunner
from gpufleet.errors import DeviceError, UsageError
from tests.energy import dvfs_by_hand as hand

cli = CliRunner()


def _node(spec: str = "1x1xh200") -> tuple[Any, Any, ManualClock]:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(spec), clock=clock)
    node = next(iter(fleet.nodes.values()))
    return node, node.backend(), clock


def _mean(backend: Any, clock: ManualClock, seconds: float) -> tuple[float, float]:
    """Mean (power W, SM clock MHz) over ``seconds`` sampled every 0.1 s through NVML."""
    pw, mhz = [], []
    for _ in range(round(seconds * 10)):
        clock.advance(0.1)
        s = backend.sample_fast(0)
        pw.append(float(s.power_w or 0))
        mhz.append(float(s.sm_clock_mhz or 0))
    return sum(pw) / len(pw), sum(mhz) / len(mhz)


def test_dvfs_model_reproduces_the_fitted_h200_points() -> None:
    """The three fitted points of load_trace.json (typed from it: idle phase mean 79.34 W at
    345 MHz; bf16 burn, util >= 99, mean 689.5 W at 1469.9 MHz; cooldown after t = 31 s, clocks
    still up, mean 123.08 W at 1980 MHz) within 1.5 % power, 2 % clock."""
    node, backend, clock = _node()
    gpu = node.gpus[0]
    p, f = _mean(backend, clock, 3)
    assert p == pytest.approx(79.34, rel=0.015) and f == 345
    gpu.run(Load(static=0.25), duration_s=20)
    _mean(backend, clock, 5)  # settle
    p, f = _mean(backend, clock, 15)
    assert p == pytest.approx(689.5, rel=0.015)
    assert f == pytest.approx(1469.9, rel=0.02)
    _mean(backend, clock, 2)  # the load ends; clocks linger at max
    p, f = _mean(backend, clock, 8)
    assert p == pytest.approx(123.08, rel=0.015) and f == 1980


def test_locked_clock_power_follows_the_dvfs_formula() -> None:
    """bf16 (i 1, s 0.25) locked at 990 and 1260 MHz, below the cap: the hand formula."""
    node, backend, clock = _node()
    gpu = node.gpus[0]
    for mhz in (990, 1260):
        backend.lock_gpu_clocks_mhz(0, mhz, mhz)
        gpu.run(Load(static=0.25), start_s=clock(), duration_s=6)
        _mean(backend, clock, 3)
        p, f = _mean(backend, clock, 3)
        assert f == mhz
        assert p == pytest.approx(hand.power(mhz / 1980, 1.0, 0.25), rel=0.01)
    # both clocks are above the knee (874 MHz by hand), where V rises with f
    assert 874 <= round(hand.KNEE * 1980) < 990
    backend.reset_gpu_clocks(0)
    assert gpu.locked_clocks_mhz is None


def test_memory_bound_locked_clock_saves_more_than_power_limit(tmp_path: Path) -> None:
    """hbm (i 0.55, s 0.6, throughput 1 - 0.1 (1 - r)) on an H200, limits 700..400 W step 100,
    clocks 1980..1020 MHz step 120, within 5 %. By hand: the baseline (700 W / 1980 MHz) is
    uncapped at power(1); 400 W holds 394.8 W at r ~0.665 (slowdown 3.4 %); 1020 MHz draws
    power(0.515) (slowdown 4.8 %): 30.1 % saved against 23.2 %, so the locked clock wins (the
    next power step, 350 W, would slow it 5.2 %)."""
    node, backend, clock = _node()
    limits = [700.0, 600.0, 500.0, 400.0]
    mhz = list(range(1980, 1019, -120))
    runner = SimRunner(node, backend, clock, "hbm")
    pl = advise(sweep(backend, [0], limits, runner, 10), 0.05)
    lc = advise(sweep_clocks(backend, [0], mhz, runner, 10, tmp_path / "locked.json"), 0.05)
    cmp = compare_knobs(pl, lc)

    def thr(r: float) -> float:
        return 1 - 0.1 * (1 - r)

    base = hand.power(1.0, 0.55, 0.6) / thr(1.0)
    r400 = hand.capped_ratio(400, 0.55, 0.6)
    want_pl = 1 - hand.capped_power(400, 0.55, 0.6) / thr(r400) / base
    want_lc = 1 - hand.power(1020 / 1980, 0.55, 0.6) / thr(1020 / 1980) / base
    assert 1 - thr(hand.capped_ratio(350, 0.55, 0.6)) > 0.05  # why 400 W is the best limit
    assert pl is not None and lc is not None
    assert pl.within_budget.limit_w == 400
    assert lc.within_budget.clock_mhz == 1020  # type: ignore[attr-defined]
    assert pl.energy_saved == pytest.approx(want_pl, abs=0.015)
    assert lc.energy_saved == pytest.approx(want_lc, abs=0.015)
    assert want_lc > want_pl + 0.05
    assert cmp.winner == "locked_clock"


def test_sweep_resets_the_clocks_after_it_and_after_an_error(tmp_path: Path) -> None:
    node, backend, clock = _node("1x2xh200")
    state = tmp_path / "locked.json"
    runner = SimRunner(node, backend, clock, "matmul-bf16")
    before = [g.locked_clocks_mhz for g in node.gpus]
    result = sweep_clocks(backend, [0, 1], [1980, 1500, 1200], runner, 4, state)
    assert result.restored and [g.locked_clocks_mhz for g in node.gpus] == before == [None, None]
    assert not state.exists()
    # unlocked again: a bf16 load settles at the cap's clock, not the last locked 1200 MHz
    node.gpus[0].run(Load(static=0.25), start_s=clock(), duration_s=10)
    _mean(backend, clock, 4)
    assert _mean(backend, clock, 4)[1] == pytest.approx(1469.9, rel=0.02)

    class Boom(RuntimeError):
        pass

    class Failing:
        unit = "x"
        calls = 0

        def run(self, gpus: Any, seconds: float) -> RunResult:
            self.calls += 1
            if self.calls == 3:  # second clock's warm-up
                assert node.gpus[1].locked_clocks_mhz == (1500, 1500)
                raise Boom
            return RunResult(dict.fromkeys(gpus, 1.0), seconds)

    with pytest.raises(Boom):
        sweep_clocks(backend, [0, 1], [1980, 1500], Failing(), 1, state)
    assert [g.locked_clocks_mhz for g in node.gpus] == [None, None]
    assert not state.exists()


def test_agent_start_resets_clocks_a_crashed_sweep_left_locked(tmp_path: Path) -> None:
    node, backend, _clock = _node("1x2xh200")
    state = tmp_path / "gpufleet" / "locked-clocks.json"
    lock_clocks(backend, [0, 1], 1200, state)  # the sweep's lock step; no finally runs
    assert [g.locked_clocks_mhz for g in node.gpus] == [(1200, 1200), (1200, 1200)]
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    assert set(read_clock_state(state)[node.name]) == {"0", "1"}
    agent = Agent(node.backend(), AgentConfig(clock_state_file=state))  # a fresh start
    try:
        assert agent.clocks_reset == [0, 1]
        assert [g.locked_clocks_mhz for g in node.gpus] == [None, None]
        assert not state.exists()
    finally:
        agent.close()


def test_a_running_sweeps_locks_are_left_alone(tmp_path: Path) -> None:
    node, backend, _clock = _node()
    state = tmp_path / "locked.json"
    lock_clocks(backend, [0], 1500, state, pid=os.getppid())  # a live process, not this one
    assert recover_locked_clocks(backend, state) == []
    assert node.gpus[0].locked_clocks_mhz == (1500, 1500)
    assert recover_locked_clocks(backend, state, alive=lambda pid: False) == [0]
    assert node.gpus[0].locked_clocks_mhz is None


def test_nvml_return_codes_become_clear_errors(tmp_path: Path) -> None:
    node, backend, _clock = _node()
    clocks = backend.supported_graphics_clocks_mhz(0)
    # the fixture's list (nvidia-smi -q -d SUPPORTED_CLOCKS): 1980 down to 345, 15 MHz apart
    assert (clocks[0], clocks[-1], len(clocks)) == (1980, 345, 110)
    with pytest.raises(DeviceError, match="not a valid clock range"):
        backend.lock_gpu_clocks_mhz(0, 1500, 2100)
    node.power_admin = False
    state = tmp_path / "locked.json"
    runner = SimRunner(node, backend, ManualClock(), "hbm")
    with pytest.raises(DeviceError, match="needs root"):
        sweep_clocks(backend, [0], [1500], runner, 1, state)
    assert not state.exists()  # refused: nothing locked, nothing recorded
    node.power_admin = True
    node.nvml.locked_clocks_supported = False
    with pytest.raises(DeviceError, match="does not support locked clocks"):
        backend.lock_gpu_clocks_mhz(0, 1500, 1500)


def test_cli_sweeps_both_knobs_and_names_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    args = ["power", "sweep", "--sim", "1x1xh200", "--workload", "hbm", "--seconds", "4"]
    args += ["--limits", "700,600,500,400", "--clocks", "1980,1860,...,1020"]
    res = cli.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["modelled"] is True and "Mei" in doc["model"]
    assert doc["knobs"]["winner"] == "locked_clock"
    assert doc["knobs"]["locked_clock"]["clock_mhz"] == 1020
    assert doc["knobs"]["power_limit"]["limit_w"] == 400
    assert [p["clock_mhz"] for p in doc["clock_sweep"]["points"]][-1] == 1020
    assert doc["clock_sweep"]["restored"] is True and doc["restored"] is True
    text = cli.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "(modelled)" in text.output and "winner: locked clock" in text.output
    # a clock the GPU does not list is refused by name before any limit is swept
    node_calls: list[int] = []
    monkeypatch.setattr(
        SimNvml, "nvmlDeviceSetPowerManagementLimit", lambda *a: node_calls.append(1)
    )
    bad = cli.invoke(app, [*args[:-2], "--clocks", "1000"])
    assert isinstance(bad.exception, UsageError) and bad.exit_code != 0
    assert "--clocks: 1000 MHz" in str(bad.exception) and node_calls == []
