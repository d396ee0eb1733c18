"""A restarted controller declares no node lost before its API listens.

The control loop starts before the app is built and bound; on a loaded machine that took longer
than a node's lost threshold (3 pushes of 0.25 s plus the restart grace, ~6 s), and the loop
declared every node lost while no agent could reach it: a campaign read 0 % in service, and
with jobs on the nodes the scheduler would have moved them all. Here the controller process is
restarted with its app build held (`GPUFLEET_TEST_API_START_DELAY_S`) past that threshold; the
agents, real processes pushing every 0.25 s, must stay in service.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gpufleet.testing.procs import AgentProcess, ControllerProcess, create_tokens
from gpufleet.testing.timescale import scaled

pytestmark = pytest.mark.process

NODES = ["g0", "g1"]
HELD_S = 9.0  # past the lost threshold of a 0.25 s push interval (0.75 + 5.5 s of grace)


def _lost_events(ctl: ControllerProcess) -> list[str]:
    events = ctl.call("GET", "/api/v1/events", params={"limit": 200}).json()
    return [f"{e['node']}: {e['message']}" for e in events if "-> lost" in e["message"]]


def test_nodes_stay_in_service_while_a_restarted_controller_builds_its_api(
    tmp_path: Path,
) -> None:
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None), **{n: ("agent", n) for n in NODES}})
    ctl = ControllerProcess(data, tokens["admin"]).start()
    agents = [AgentProcess(n, ctl.url, tokens[n], tmp_path / n).start() for n in NODES]
    try:
        for n in NODES:
            ctl.wait_in_service(n, scaled(120))
        ctl.kill9()
        ctl.env = {"GPUFLEET_TEST_API_START_DELAY_S": f"{HELD_S:g}"}
        ctl.start(wait_s=scaled(120))
        log = (data / "controller-2.log").read_text(encoding="utf-8")
        assert "test hook active: GPUFLEET_TEST_API_START_DELAY_S" in log  # the hold happened
        for n in NODES:
            ctl.wait_in_service(n, scaled(30))  # heard again once the API listens
        assert _lost_events(ctl) == [], log
    finally:
        for a in agents:
            a.stop()
        ctl.stop()


PUSH_S = 0.5  # lost after 1.5 s of silence
PAUSED_S = 4.0  # past that threshold, under the agents' 5 s push timeout


def test_a_controller_stopped_for_seconds_declares_no_pushing_node_lost(tmp_path: Path) -> None:
    """The controller process stopped (SIGSTOP: what a starved machine does to it for a while)
    while its agents keep pushing every 0.5 s: their requests wait in its sockets. Resumed, its
    control loop wakes first and, counting the pause as the nodes' silence, declared every node lost
    (seen under the suite's load: two pushing agents lost at once after a restart). The pause
    is deaf time (`gpufleet.control.state.deafness`): no node goes lost."""
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None), **{n: ("agent", n) for n in NODES}})
    ctl = ControllerProcess(data, tokens["admin"]).start()
    agents = [
        AgentProcess(n, ctl.url, tokens[n], tmp_path / n, push_interval_s=PUSH_S).start()
        for n in NODES
    ]
    try:
        for n in NODES:
            ctl.wait_in_service(n, scaled(120))
        assert ctl.proc is not None
        for _ in range(3):
            ctl.proc.send_signal(signal.SIGSTOP)
            time.sleep(PAUSED_S)
            ctl.proc.send_signal(signal.SIGCONT)
            time.sleep(2.0)  # the agents' waiting pushes land; a lost check runs meanwhile
        for n in NODES:
            ctl.wait_in_service(n, scaled(30))
        assert _lost_events(ctl) == []
    finally:
        if ctl.proc is not None and ctl.proc.poll() is None:
            ctl.proc.send_signal(signal.SIGCONT)
        for a in agents:
            a.stop()
        ctl.stop()
