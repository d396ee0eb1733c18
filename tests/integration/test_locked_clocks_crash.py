"""Locked clocks left by a crashed sweep are reset at the next agent start, through real
processes (issue 31; docs/energy.md "Second knob": "after a crash (kill -9, OOM) the next
`gpufleet agent` start ... resets the clocks that a process no longer running left locked").

A real controller and a real simulated agent; a real ``gpufleet power sweep --sim --clocks``
locks both GPUs at 1200 MHz and is kill -9ed mid-measurement, the agent too. The simulated GPUs
keep the lock after both die (as real ones do: `gpufleet.devices.sim.locks`), so the test cannot
pass without a reset. The restarted agent resets them once: its log line, one
``locked_clocks_reset`` event per GPU through the API naming the clock and the dead sweep's pid,
the controller's telemetry showing the SM clock back at idle (345 MHz; locked, an idle GPU holds
1200), the simulator's record and the sweep's record gone. Another restart resets nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devices.sim.locks import lock_file, read_locks
from gpufleet.testing.procs import AgentProcess, ControllerProcess, child_env, create_tokens
from tests.integration.processes import GPUFLEET
from tests.waiting import wait_truthy

pytestmark = pytest.mark.process

NODE, LOCKED_MHZ, IDLE_MHZ = "lk", 1200, 345  # 345: the simulator's idle SM clock (H200 trace)
KIND = "locked_clocks_reset"


def _events(ctl: ControllerProcess) -> list[dict[str, Any]]:
    r = ctl.call("GET", "/api/v1/events", params={"node": NODE, "kind": KIND})
    assert r.status_code == 200, r.text
    return sorted(r.json(), key=lambda e: e["data"]["detail"])


def _sm_clocks(ctl: ControllerProcess, since_s: float) -> list[float] | None:
    """The SM clock of each GPU in the controller's latest telemetry, once newer than
    ``since_s`` for both."""
    r = ctl.call("GET", f"/api/v1/nodes/{NODE}")
    if r.status_code != 200:
        return None
    gpus = r.json()["node"]["gpu_latest"]
    if len(gpus) != 2 or any((g["t"] or 0) <= since_s for g in gpus):
        return None
    clocks = [g["metrics"].get("sm_clock_mhz") for g in gpus]
    return None if None in clocks else clocks


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[ControllerProcess, AgentProcess, dict[str, str]]]:
    tokens = create_tokens(tmp_path / "ctl", {"admin": ("admin", None), NODE: ("agent", NODE)})
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg")}  # the sweep's and agent's lock record
    ctl = ControllerProcess(tmp_path / "ctl", tokens["admin"]).start()
    agent = AgentProcess(NODE, ctl.url, tokens[NODE], tmp_path / "agent", model="h200-sxm", env=env)
    try:
        agent.start()
        ctl.wait_in_service(NODE, 120)
        yield ctl, agent, env
    finally:
        agent.stop()
        ctl.stop()


def test_a_crashed_sweeps_locked_clocks_are_reset_once_at_the_next_agent_start(
    rig: tuple[ControllerProcess, AgentProcess, dict[str, str]], tmp_path: Path
) -> None:
    ctl, agent, env = rig
    fleet = agent.state_dir / "fleet.yaml"  # the agent's own fleet file: the same node
    sim_locks = lock_file(fleet, NODE)
    record = Path(env["XDG_STATE_HOME"]) / "gpufleet" / "locked-clocks.json"
    with open(tmp_path / "sweep.log", "wb") as out:
        sweep = subprocess.Popen(
            [
                *GPUFLEET,
                *("power", "sweep", "--sim", str(fleet), "--clocks", str(LOCKED_MHZ)),
                *("--workload", "sleep 300", "--rate-regex", r"(\d+)", "--seconds", "300"),
                "--json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**child_env(), **env},
            start_new_session=True,  # its workload (sleep) dies with it
        )
    try:
        wait_truthy(
            lambda: read_locks(sim_locks) == {0: (LOCKED_MHZ,) * 2, 1: (LOCKED_MHZ,) * 2},
            60,
            "the sweep locking both GPUs",
        )
        mine = json.loads(record.read_text("utf-8"))["locked"][NODE]
        assert {g: r["pid"] for g, r in mine.items()} == {"0": sweep.pid, "1": sweep.pid}
        os.killpg(sweep.pid, signal.SIGKILL)  # an OOM kill: no finally runs
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
        sweep.wait()
    agent.kill9()
    # both processes dead: the GPUs stay locked (a real GPU's lock outlives its process)
    assert read_locks(sim_locks) == {0: (LOCKED_MHZ,) * 2, 1: (LOCKED_MHZ,) * 2}
    assert record.exists() and _events(ctl) == []

    restarted_s = time.time()
    agent.start()
    events = wait_truthy(lambda: _events(ctl) if len(_events(ctl)) >= 2 else [], 60, KIND)
    assert [e["data"]["detail"] for e in events] == [
        f"locked clocks reset on gpu {g} at agent start: {LOCKED_MHZ} MHz, left locked by "
        f"process {sweep.pid}, which ended without resetting them"
        for g in (0, 1)
    ]
    assert not sim_locks.exists() and not record.exists()
    log = agent.state_dir / f"agent-{agent.starts}.log"
    assert log.read_text("utf-8").count("reset clocks a crashed sweep had locked") == 1
    # what the node reports since: idle at the driver's default, not held at 1200 MHz
    clocks = wait_truthy(lambda: _sm_clocks(ctl, restarted_s + 1), 60, "telemetry after it")
    assert clocks == [IDLE_MHZ, IDLE_MHZ]

    agent.kill9()  # once reset, a restart resets nothing again
    again_s = time.time()
    agent.start()
    wait_truthy(lambda: _sm_clocks(ctl, again_s + 1), 60, "telemetry after the next restart")
    assert len(_events(ctl)) == 2
    log = agent.state_dir / f"agent-{agent.starts}.log"
    assert "reset clocks" not in log.read_text("utf-8")
