"""Energy accounting end to end (issue 16): the real agent samples simulated H100s (NVML's
energy counter on the slow tier, power on the fast one) and pushes to a real controller, which
accounts energy per GPU and minute and persists it.

The expected energy is the integral of the simulator's own power state, sampled every 50 ms
by the test itself (trapezoids), independent of the counter and of the controller's code.
GPU 1's counter starts just below 2**64 (it wraps within seconds); GPU 0's counter is reset to
zero mid-run (a driver reload): that window comes from the power samples. The controller is
killed 90 s after its last flush (the controller flushes every 15 s); the counter covers the
gap after the restart (a reset in such an unflushed gap would lose the gap's energy: its power
samples died with the process).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.control.db.models import EnergyMinute
from gpufleet.control.energy.query import parse_since, report
from gpufleet.control.ingest.queue import parse_batch
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.store import IngestItem
from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.sim.gpu import Load
from gpufleet.errors import UsageError

AGENT = Principal(None, "test", Role.AGENT)
ADMIN = Principal(None, "admin", Role.ADMIN)


def _push(svc: ControlService, agent: Agent, seq: int) -> None:
    body = agent.build_batch(seq).model_dump_json().encode()
    parsed = parse_batch(body)
    svc.ingest.submit_sync(IngestItem(parsed.batch, AGENT, svc.clock(), parsed.arrays))


def _stored_joules(svc: ControlService) -> dict[int, float]:
    from gpufleet.control.state.energy_ledger import minute_joules

    out: dict[int, float] = {}
    with svc.store.sessions() as s:
        for r in s.scalars(select(EnergyMinute)):
            j = minute_joules(r.window_j, r.window_s, r.power_j, r.power_s)
            out[r.gpu_index] = out.get(r.gpu_index, 0.0) + j
    return out


def test_accounted_energy_matches_the_integral_of_power_through_wrap_reset_and_restart(
    make_service: Callable[..., ControlService], clock: ManualClock, tmp_path: Path
) -> None:
    fleet = SimFleet(parse_fleet_spec("1x2xh100-sxm"), clock=clock)
    node = next(iter(fleet.nodes.values()))
    gpus = node.gpus
    gpus[1].energy_offset_mj = (
        2**64 - 3_000_000 - int(gpus[1].state.energy_mj)
    )  # 3 kJ below the top: wraps at once
    agent = Agent(
        node.backend(),
        AgentConfig(controller="http://127.0.0.1:9", state_dir=tmp_path / "agent"),
        clock=clock,
    )
    try:
        _run_and_check(make_service, clock, node, gpus, agent)
    finally:
        agent.close()  # its sampling lanes (one per GPU, one for events) end with it


def _run_and_check(
    make_service: Callable[..., ControlService],
    clock: ManualClock,
    node: Any,
    gpus: Any,
    agent: Agent,
) -> None:
    svc = make_service()
    truth = [0.0, 0.0]
    last_p = [g.state.power_w for g in gpus]
    seq = 0
    start = clock()
    for g in gpus:  # busy, idle, busy at half intensity: power moves through its range
        g.run(Load(util=1.0), start + 40, 150)
        g.run(Load(util=0.6, intensity=0.5), start + 300, 200)
    steps_per_s = 20
    duration_s = 600
    for i in range(duration_s * steps_per_s + 1):
        if i:
            clock.advance(1 / steps_per_s)
            for k, g in enumerate(gpus):
                g.advance(clock())
                truth[k] += (last_p[k] + g.state.power_w) / 2 / steps_per_s
                last_p[k] = g.state.power_w
        if i % steps_per_s:
            continue
        sec = i // steps_per_s
        if sec == 200:
            gpus[0].state.energy_mj = 0.0  # driver reload: the counter restarts from zero
        agent.tick()
        if sec % 10 == 0:
            seq += 1
            _push(svc, agent, seq)
        if sec % 15 == 0 and not 240 < sec < 330:  # the controller's periodic flush
            svc.flush_rollups()
        if sec == 330:  # killed without a final flush; a new controller on the same database
            svc.ingest.stop()
            svc.engine.dispose()
            svc = make_service()
    svc.flush_rollups()
    got = _stored_joules(svc)
    for k in (0, 1):
        assert got[k] == pytest.approx(truth[k], rel=0.01), (k, got[k], truth[k])
    # the controller knew which window came from where: the reset one from power
    with svc.store.sessions() as s:
        fallback = {
            g: sum(r.fallback_j for r in s.scalars(select(EnergyMinute)) if r.gpu_index == g)
            for g in (0, 1)
        }
    assert fallback[0] > 0 and fallback[1] == 0
    # the report in kWh adds the same up
    rep = report(svc.store, ADMIN, "node", 86400.0, clock())
    assert rep["total"]["kwh"] == pytest.approx(sum(truth) / 3.6e6, rel=0.01)
    assert "cost" not in rep["total"]  # no price in the policy: no cost, not a cost of 0
    assert rep["rows"][0]["key"] == node.name
    # idle waste: the node went in service; between loads it idled near the H100's idle power
    idle = rep["total"]["idle_kwh"]
    assert 0 < idle < rep["total"]["kwh"]


def test_price_and_grid_intensity_make_cost_and_co2(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    from gpufleet.control.energy.query import Sums, figures
    from gpufleet.control.state.remediation import RemediationPolicy

    pol = RemediationPolicy(energy_price_per_kwh=0.2, grid_gco2_per_kwh=400.0)
    f = figures(Sums(joules=7.2e6, counter_j=7.2e6, gpu_s=3600.0), pol)
    assert f["kwh"] == pytest.approx(2.0)
    assert f["cost"] == pytest.approx(0.4)
    assert f["co2_kg"] == pytest.approx(0.8)
    assert f["method"] == "counter"


@pytest.mark.parametrize("bad", ["30", "abc", "-5d", "0d", "10y", "400d", ""])
def test_a_bad_since_is_a_clear_error(bad: str) -> None:
    with pytest.raises(UsageError, match="since"):
        parse_since(bad)


def test_since_units() -> None:
    assert parse_since("30d") == 30 * 86400
    assert parse_since("12h") == 12 * 3600
    assert parse_since("90m") == 5400
    assert json.dumps(parse_since("1.5w"))


def test_an_implausible_counter_jump_is_not_trusted(
    make_service: Callable[..., ControlService], clock: ManualClock
) -> None:
    """A counter that jumps by more than any GPU could draw (a broken or hostile agent) is
    treated like a reset: the window's energy comes from the power samples."""
    svc = make_service()
    t0 = clock()
    body = {
        "schema_version": 1,
        "node": "n1",
        "agent_id": "a",
        "seq": 1,
        "sent_at_s": t0,
        "heartbeat_interval_s": 2.0,
        "health": 0,
        "findings": [],
        "samples": [
            {
                "gpu_uuid": "GPU-1",
                "gpu_index": 0,
                "t": [t0 + i for i in range(61)],
                "fields": {"power_w": [400.0] * 61, "gpu_util_pct": [90.0] * 61},
            },
            {  # 60 s apart, 1e15 mJ more: 1.7e10 W
                "gpu_uuid": "GPU-1",
                "gpu_index": 0,
                "t": [t0, t0 + 60],
                "fields": {"energy_mj": [1.0e6, 1.0e15]},
            },
        ],
    }
    parsed = parse_batch(json.dumps(body).encode())
    svc.ingest.submit_sync(IngestItem(parsed.batch, AGENT, t0, parsed.arrays))
    svc.flush_rollups()
    assert _stored_joules(svc)[0] == pytest.approx(400.0 * 60, rel=1e-6)
