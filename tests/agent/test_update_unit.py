"""The agent's update unit (issue 15): a command runs once per key, detached (it outlives the
process that started it), with its timeout; the result file holds the exit code and the
output's tail, private to the agent's user."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.maintenance import AgentMaintenance
from gpufleet.agent.update_unit import result_path, run_unit, write_private
from gpufleet.wire import WireUpdateOrder

pytestmark = pytest.mark.process


def test_exit_code_and_output_tail(tmp_path: Path) -> None:
    doc = run_unit(tmp_path, "k1", 30, "echo first; echo last line; exit 3")
    assert doc["exit_code"] == 3 and doc["timed_out"] is False
    assert str(doc["output_tail"]).strip().splitlines()[-1] == "last line"
    res = result_path(tmp_path, "k1")
    assert json.loads(res.read_text())["exit_code"] == 3
    assert stat.S_IMODE(res.stat().st_mode) == 0o600


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    t0 = time.monotonic()
    cmd = f"(sleep 3; touch {marker}) & sleep 30"
    doc = run_unit(tmp_path, "k2", 0.5, cmd)
    assert doc["timed_out"] is True and doc["exit_code"] is None
    assert time.monotonic() - t0 < 30 / 2  # killed at the 0.5 s timeout, not the 30 s sleep
    time.sleep(3.5)
    assert not marker.exists()  # the background child died with its group


def test_an_order_runs_once_per_key_detached(tmp_path: Path) -> None:
    closed: list[bool] = []
    with httpx.Client() as client:
        m = AgentMaintenance(
            tmp_path,
            "n1",
            "http://127.0.0.1:9",
            "gf_x",
            client,
            close_devices=lambda: closed.append(True),
        )
        runs = tmp_path / "runs"
        order = WireUpdateOrder(key="c1-n1", command=f"echo $GPUFLEET_NODE >> {runs}", timeout_s=30)
        assert m.order(order) is True
        assert m.order(order) is False  # the same key again (a resent order): not run
        res = result_path(m.root, "c1-n1")
        deadline = time.monotonic() + 20
        while not res.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(res.read_text())["exit_code"] == 0
        assert runs.read_text().split() == ["n1"]
        assert closed == [True]  # NVML closed before the command
        assert m.updating.is_set()
        # a new agent process on the same state directory does not run it again either
        again = AgentMaintenance(
            tmp_path, "n1", "http://127.0.0.1:9", "gf_x", client, close_devices=lambda: None
        )
        assert again.order(order) is False
        assert not again.updating.is_set()  # the unit ended: NVML may open at start
        assert stat.S_IMODE(os.stat(m.root).st_mode) == 0o700


@pytest.mark.parametrize(("exit_code", "restarts"), [(0, True), (3, False)])
def test_an_agent_begun_after_its_update_restarts_once_the_outcome_is_taken(
    tmp_path: Path, exit_code: int, restarts: bool
) -> None:
    """The controller takes a node as back from its update only when its GPUs are described
    after it has the outcome. An agent process begun after the unit ended (it found the
    result at its start, NVML open afresh) described them before its report was taken, so
    after a success it restarts too, and its next process describes them again (the old code
    restarted only a process that had shut NVML down itself, and the node waited in
    rebooting for a description that never came). A failed update needs no new description."""
    root = tmp_path / "maintenance"
    root.mkdir(mode=0o700)
    write_private(root / "c1-n1.started.json", {"key": "c1-n1", "at_s": 1.0})
    write_private(
        result_path(root, "c1-n1"),
        {"key": "c1-n1", "exit_code": exit_code, "timed_out": False, "output_tail": ""},
    )
    posted: list[str] = []

    def controller(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content)["key"])
        return httpx.Response(200, json={"taken": True})

    with httpx.Client(transport=httpx.MockTransport(controller)) as client:
        m = AgentMaintenance(
            tmp_path, "n1", "http://ctl.test", "gf_x", client, close_devices=lambda: None
        )
        assert not m.updating.is_set()  # NVML may open at start: the unit ended
        m.poll()
        m.poll()  # reported once: not again
    assert posted == ["c1-n1"]
    assert m.restart_wanted.is_set() is restarts
