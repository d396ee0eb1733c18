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
from gpufleet.agent.update_unit import result_path, run_unit
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
