"""The agent's side of a power order (`gpufleet.agent.power.AgentPower`) on a simulated node,
whose NVML answers set-limit calls as the driver does: each key acts once, a restore puts back
the limits from before gpufleet touched them, a restore before its apply cancels the apply, and a
GPU NVML refuses is reported with NVML's error while the others are set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.power import AgentPower
from gpufleet.wire import WirePowerOrder
from tests.agent.conftest import boot_node


def _power(tmp_path: Path, backend: Any) -> AgentPower:
    client = httpx.Client()  # not used: these tests read the result files
    return AgentPower(tmp_path / "state", backend, "n0", "http://127.0.0.1:9", "t", client)


def _result(p: AgentPower, key: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((p.root / f"{key}.result.json").read_text("utf-8"))
    return doc


def test_apply_once_per_key_then_restore(tmp_path: Path) -> None:
    node, backend = boot_node(tmp_path)
    p = _power(tmp_path, backend)
    p.run(WirePowerOrder(key="po1-n0-apply", action="apply", limits={"*": 500}))
    assert [backend.power_limit_w(g) for g in (0, 1)] == [500.0, 500.0]
    calls = node.nvml.set_limit_calls
    # sent again (a controller restart): answered from the result, NVML not called again
    p.run(WirePowerOrder(key="po1-n0-apply", action="apply", limits={"*": 450}))
    assert node.nvml.set_limit_calls == calls
    assert [backend.power_limit_w(g) for g in (0, 1)] == [500.0, 500.0]
    # a second order on GPU 1, then restoring it: back to the limit from before gpufleet
    p.run(WirePowerOrder(key="po2-n0-apply", action="apply", limits={"1": 400}))
    p.run(WirePowerOrder(key="po2-n0-restore", action="restore", limits={"1": 400}))
    assert backend.power_limit_w(1) == 700.0
    assert backend.power_limit_w(0) == 500.0
    rows = _result(p, "po2-n0-restore")["gpus"]
    assert [(r["gpu"], r["from_w"], r["to_w"], r["ok"]) for r in rows] == [(1, 400.0, 700.0, True)]
    mode = (p.root / "limits.json").stat().st_mode & 0o777
    assert mode == 0o600


def test_a_restore_before_its_apply_cancels_the_apply(tmp_path: Path) -> None:
    node, backend = boot_node(tmp_path)
    p = _power(tmp_path, backend)
    p.run(WirePowerOrder(key="po3-n0-restore", action="restore", limits={"*": 500}))
    assert "cancelled" in _result(p, "po3-n0-apply")["error"]
    p.run(WirePowerOrder(key="po3-n0-apply", action="apply", limits={"*": 500}))  # late
    assert node.nvml.set_limit_calls == 0
    assert [backend.power_limit_w(g) for g in (0, 1)] == [700.0, 700.0]


def test_nvml_refusals_are_per_gpu_and_leave_nothing_to_restore(tmp_path: Path) -> None:
    _, backend = boot_node(tmp_path, power_admin=False)
    p = _power(tmp_path, backend)
    p.run(WirePowerOrder(key="po4-n0-apply", action="apply", limits={"0": 400, "1": 50}))
    rows = _result(p, "po4-n0-apply")["gpus"]
    assert "NVML_ERROR_NO_PERMISSION" in rows[0]["error"]
    assert "allowed 200-700 W" in rows[1]["error"]  # the range is checked first, as the driver
    assert not any(r["ok"] for r in rows)
    # nothing was changed, so nothing is recorded for a restore to (fail to) put back
    assert json.loads((p.root / "limits.json").read_text("utf-8"))["previous"] == {}


def test_only_the_refused_gpu_is_left_out(tmp_path: Path) -> None:
    _, backend = boot_node(tmp_path)
    p = _power(tmp_path, backend)
    p.run(WirePowerOrder(key="po5-n0-apply", action="apply", limits={"0": 450, "1": 9999}))
    rows = {r["gpu"]: r for r in _result(p, "po5-n0-apply")["gpus"]}
    assert rows[0]["ok"] and backend.power_limit_w(0) == 450.0
    assert not rows[1]["ok"] and backend.power_limit_w(1) == 700.0
    previous = json.loads((p.root / "limits.json").read_text("utf-8"))["previous"]
    assert previous == {"n0": {"0": 700.0}}
