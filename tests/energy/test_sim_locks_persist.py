"""A simulated GPU keeps its locked clocks after the process that locked them is gone, as a
real one does until a reset (NVML API Reference, nvmlDeviceSetGpuLockedClocks), so the
agent's reset of a crashed sweep's locks can be tested across processes (issue 31): the next
simulator of the same fleet file starts locked, its reset clears the lock for every later one,
and an agent start resets what a dead process left (its events say what and by whom)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from gpufleet.agent.runner import CLOCKS_RESET, Agent, AgentConfig
from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.sim.locks import lock_file, read_locks
from gpufleet.energy.clocks import lock_clocks, read_clock_state

DEAD_PID = 2**22 + 12345  # above Linux's pid_max: no such process


def _fleet(path: Path) -> SimFleet:
    return SimFleet(parse_fleet_spec(str(path)), clock=ManualClock(1000.0))


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    doc = {"nodes": [{"name": "lk", "model": "h200-sxm", "gpus": 2}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_a_lock_outlives_its_simulator_until_a_reset(tmp_path: Path) -> None:
    path = _file(tmp_path)
    first = _fleet(path).node("lk").backend()
    first.lock_gpu_clocks_mhz(1, 1200, 1200)
    kept = lock_file(path, "lk")
    assert read_locks(kept) == {1: (1200, 1200)}
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # another process's simulator of the same file: GPU 1 still locked, GPU 0 not
    later = _fleet(path).node("lk")
    assert [g.locked_clocks_mhz for g in later.gpus] == [None, (1200, 1200)]
    later.backend().reset_gpu_clocks(1)
    assert not kept.exists()
    assert [g.locked_clocks_mhz for g in _fleet(path).node("lk").gpus] == [None, None]


def test_a_short_spec_keeps_its_locks_in_memory_only(tmp_path: Path) -> None:
    fleet = SimFleet(parse_fleet_spec("1x2xh200"), clock=ManualClock(1000.0))
    node = next(iter(fleet.nodes.values()))
    assert node.lock_file is None
    node.backend().lock_gpu_clocks_mhz(0, 1500, 1500)
    assert node.gpus[0].locked_clocks_mhz == (1500, 1500)
    other = next(iter(SimFleet(parse_fleet_spec("1x2xh200")).nodes.values()))
    assert other.gpus[0].locked_clocks_mhz is None


def test_an_agent_start_resets_a_dead_sweeps_locks_and_reports_them(tmp_path: Path) -> None:
    path = _file(tmp_path)
    state = tmp_path / "locked-clocks.json"
    lock_clocks(_fleet(path).node("lk").backend(), [0, 1], 1200, state, pid=DEAD_PID)
    node = _fleet(path).node("lk")  # the agent's own simulator, started after the crash
    assert [g.locked_clocks_mhz for g in node.gpus] == [(1200, 1200), (1200, 1200)]
    agent = Agent(node.backend(), AgentConfig(clock_state_file=state, state_dir=tmp_path / "a"))
    try:
        assert agent.clocks_reset == [0, 1]
        assert [g.locked_clocks_mhz for g in node.gpus] == [None, None]
        assert not lock_file(path, "lk").exists() and not state.exists()
        events = agent._pending_events
        assert [(e.gpu_index, e.kind) for e in events] == [(0, CLOCKS_RESET), (1, CLOCKS_RESET)]
        assert events[0].detail == (
            f"locked clocks reset on gpu 0 at agent start: 1200 MHz, left locked by process "
            f"{DEAD_PID}, which ended without resetting them"
        )
    finally:
        agent.close()
    assert read_clock_state(state) == {} and os.getpid() != DEAD_PID
