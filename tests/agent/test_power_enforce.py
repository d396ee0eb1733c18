"""Keeping a power order's limits in force (`gpufleet.agent.power_enforce`) on a simulated node,
whose NVML answers as the driver does. A reboot is a node built afresh from the same fleet file:
its GPUs come back at their default limit (700 W, h100-sxm), the agent's state dir is kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.power import AgentPower
from gpufleet.agent.power_enforce import FAILED, REAPPLIED
from gpufleet.devices.sim import SimNode
from gpufleet.testing.testbed import wait_for
from gpufleet.wire import WirePowerOrder
from tests.agent.conftest import boot_node

DEFAULT_W = 700.0


def _agent(tmp_path: Path, backend: Any, interval_s: float = 60.0) -> AgentPower:
    client = httpx.Client()  # not used: these tests read files, limits and events
    return AgentPower(
        tmp_path / "state", backend, "n0", "http://127.0.0.1:9", "t", client,
        check_interval_s=interval_s,
    )  # fmt: skip


def _apply(p: AgentPower, oid: int, limits: dict[str, float]) -> None:
    p.run(WirePowerOrder(key=f"po{oid}-n0-apply", action="apply", limits=limits))


def _applied_then_rebooted(
    tmp_path: Path, oid: int, interval_s: float
) -> tuple[SimNode, Any, AgentPower]:
    """Order ``oid`` (every GPU at 500 W) applied, then the node rebooted (700 W again): the
    node, its backend, and the new boot's agent (checking every ``interval_s``), started."""
    _, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend)
    _apply(p, oid, {"*": 500})
    node, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend, interval_s=interval_s)
    p.start()
    return node, backend, p


def _limits(backend: Any) -> list[float]:
    return [backend.power_limit_w(g) for g in (0, 1)]


def _previous(p: AgentPower) -> Any:
    return json.loads(p.limits_file.read_text("utf-8"))["previous"]


def test_a_reboot_gets_the_limits_back(tmp_path: Path) -> None:
    _, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend)
    _apply(p, 1, {"*": 500})
    in_force = p.root / "in-force.json"
    assert in_force.stat().st_mode & 0o777 == 0o600
    assert json.loads(in_force.read_text("utf-8"))["gpus"] == {
        "0": {"watts": 500.0, "key": "po1-n0-apply"},
        "1": {"watts": 500.0, "key": "po1-n0-apply"},
    }
    previous = _previous(p)
    assert p.enforcer.check() == 0 and p.take_events() == []  # held: nothing to do

    node, backend = boot_node(tmp_path)  # reboot: 700 W again, the order still "ok"
    assert _limits(backend) == [DEFAULT_W, DEFAULT_W]
    p = _agent(tmp_path, backend)
    assert p.enforcer.check() == 2
    assert _limits(backend) == [500.0, 500.0]
    events = p.take_events()
    assert [(e.gpu_index, e.kind) for e in events] == [(0, REAPPLIED), (1, REAPPLIED)]
    assert (
        events[0].detail == "power limit re-applied on gpu 0: 700 W -> 500 W (order po1-n0-apply)"
    )
    assert _previous(p) == previous == {"n0": {"0": DEFAULT_W, "1": DEFAULT_W}}  # never rewritten
    calls = node.nvml.set_limit_calls
    assert p.enforcer.check() == 0 and node.nvml.set_limit_calls == calls
    # restore still goes back to the limits from before gpufleet
    p.run(WirePowerOrder(key="po1-n0-restore", action="restore", limits={"*": 500}))
    assert _limits(backend) == [DEFAULT_W, DEFAULT_W]


def test_only_gpus_with_a_limit_in_force_are_touched(tmp_path: Path) -> None:
    node, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend)
    _apply(p, 2, {"1": 450})
    backend.set_power_limit_w(0, 650)  # someone's nvidia-smi -pl on a GPU no order holds
    backend.set_power_limit_w(1, 600)  # ... and on the one the order holds
    calls = node.nvml.set_limit_calls
    assert p.enforcer.check() == 1
    assert _limits(backend) == [650.0, 450.0]
    assert node.nvml.set_limit_calls == calls + 1
    (ev,) = p.take_events()
    assert ev.gpu_index == 1 and "600 W -> 450 W (order po2-n0-apply)" in ev.detail


def test_a_restored_order_is_not_applied_again_after_a_reboot(tmp_path: Path) -> None:
    _, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend)
    _apply(p, 3, {"*": 500})
    _apply(p, 4, {"1": 400})
    p.run(WirePowerOrder(key="po4-n0-restore", action="restore", limits={"1": 400}))
    # the restore put GPU 1 back (to the limit from before gpufleet); GPU 0 is still po3's
    assert json.loads((p.root / "in-force.json").read_text("utf-8"))["gpus"] == {
        "0": {"watts": 500.0, "key": "po3-n0-apply"}
    }
    p.run(WirePowerOrder(key="po3-n0-restore", action="restore", limits={"*": 500}))
    assert json.loads((p.root / "in-force.json").read_text("utf-8"))["gpus"] == {}
    node, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend)
    assert p.enforcer.check() == 0
    assert node.nvml.set_limit_calls == 0 and _limits(backend) == [DEFAULT_W, DEFAULT_W]
    assert p.take_events() == []


def test_a_refused_gpu_is_reported_once_and_not_retried_each_check(tmp_path: Path) -> None:
    _, backend = boot_node(tmp_path)
    p = _agent(tmp_path, backend, interval_s=10.0)
    _apply(p, 5, {"0": 500})
    node, backend = boot_node(tmp_path, power_admin=False)  # back, but the agent is not root now
    p = _agent(tmp_path, backend, interval_s=10.0)
    now = [1000.0]
    p.enforcer.clock = lambda: now[0]
    assert p.enforcer.check() == 0
    assert node.nvml.set_limit_calls == 1
    (ev,) = p.take_events()
    assert ev.kind == FAILED and ev.gpu_index == 0
    assert "re-apply refused on gpu 0: 700 W -> 500 W (order po5-n0-apply)" in ev.detail
    assert "NVML_ERROR_NO_PERMISSION" in ev.detail and "next try in 20 s" in ev.detail
    for _ in range(5):  # the checks before the backoff ends do not call NVML
        now[0] += 3.0
        p.enforcer.check()
    assert node.nvml.set_limit_calls == 1
    now[0] = 1021.0  # past the backoff: tried again, refused again, logged but not reported
    p.enforcer.check()
    assert node.nvml.set_limit_calls == 2 and p.take_events() == []
    now[0] += 39.0  # the backoff doubled (40 s)
    p.enforcer.check()
    assert node.nvml.set_limit_calls == 2
    node.power_admin = True  # the permission is back: the next due check puts the limit back
    now[0] += 2.0
    assert p.enforcer.check() == 1 and backend.power_limit_w(0) == 500.0
    assert [e.kind for e in p.take_events()] == [REAPPLIED]
    assert _previous(p) == {"n0": {"0": DEFAULT_W}}


def test_the_power_thread_checks_after_the_first_ack_and_then_periodically(
    tmp_path: Path,
) -> None:
    _, backend, p = _applied_then_rebooted(tmp_path, 6, interval_s=0.2)
    try:
        p.acked()
        wait_for(lambda: _limits(backend) == [500.0, 500.0], 10, "limits back", 0.02)
        backend.set_power_limit_w(1, 620)  # drift: the periodic check puts it back
        wait_for(lambda: backend.power_limit_w(1) == 500.0, 10, "GPU 1 back", 0.02)
        assert [e.detail.split(":")[0] for e in p.take_events()] == [
            "power limit re-applied on gpu 0",
            "power limit re-applied on gpu 1",
            "power limit re-applied on gpu 1",
        ]
    finally:
        p.close()


def test_a_restore_waiting_on_the_controller_runs_before_the_first_check(tmp_path: Path) -> None:
    """Restored while the node was down: the first Ack's restore runs before the limits are
    checked, so the order's limit is never set again."""
    node, backend, p = _applied_then_rebooted(tmp_path, 7, interval_s=30.0)
    try:
        p.orders([WirePowerOrder(key="po7-n0-restore", action="restore", limits={"*": 500})])
        p.acked()
        wait_for(lambda: (p.root / "po7-n0-restore.result.json").exists(), 10, "restored", 0.02)
        p._queue.put("check")  # one more check after the restore: nothing is held
        p._queue.put("stop")
        assert p._thread is not None
        p._thread.join(10)
        assert not p._thread.is_alive()
        assert _limits(backend) == [DEFAULT_W, DEFAULT_W]
        assert node.nvml.set_limit_calls == 2  # the restore's two, never 500 W again
        assert p.take_events() == []
    finally:
        p.close()


@pytest.mark.process
def test_the_check_interval_is_checked_by_the_cli() -> None:
    argv = [sys.executable, "-m", "gpufleet", "agent", "--sim", "1x2xh100"]
    out = subprocess.run(
        [*argv, "--power-check-interval", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--power-check-interval must be > 0" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
