"""Hung GPUs through the real CLI (issue 14 item 5): `health`, `status`, `inventory`, `doctor` and
`validate --level 1` on a simulated node whose GPUs 3, 5 and 7 hang every NVML call for an hour.

Each command names the hung GPUs ("GPU 7 did not answer NVML within 5 s") and finishes; `health`
fails the node with a GPU_NVML_TIMEOUT finding per hung GPU and takes at most one NVML deadline
more than on a healthy node (the issue's bound: within 10 s, whatever the number of hung GPUs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devices.deadline import NVML_TIMEOUT_S

pytestmark = [pytest.mark.slow, pytest.mark.process]

HUNG = (3, 5, 7)


def _fleet(tmp: Path, hung: tuple[int, ...]) -> str:
    lines = ["seed: 5", "nodes:", "  - {name: gpu-a-01, model: h100-sxm, gpus: 8}"]
    if hung:
        lines.append("faults:")
        lines += [
            f"  - {{node: gpu-a-01, gpu: {g}, kind: hung_call, at_s: 0, seconds: 3600}}"
            for g in hung
        ]
    else:
        lines.append("faults: []")
    path = tmp / f"fleet-{len(hung)}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _gpufleet(*args: str, timeout: float = 120) -> tuple[int, Any, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.monotonic() - t0
    return proc.returncode, json.loads(proc.stdout), wall


def _said(doc: Any) -> set[int]:
    text = json.dumps(doc)
    return {g for g in range(8) if f"GPU {g} did not answer NVML within 5 s" in text}


def test_health_fails_each_hung_gpu_within_one_deadline(tmp_path: Path) -> None:
    _, healthy, healthy_wall = _gpufleet("health", "--sim", _fleet(tmp_path, ()), "--exit-code")
    assert healthy["verdict"] == "ok"
    code, doc, wall = _gpufleet("health", "--sim", _fleet(tmp_path, HUNG), "--exit-code")
    assert code == 2 and doc["verdict"] == "fail"
    findings = doc["nodes"][0]["findings"]
    timeouts = {f["gpu_index"]: f for f in findings if f["code"] == "GPU_NVML_TIMEOUT"}
    assert sorted(timeouts) == list(HUNG)
    assert timeouts[7]["message"] == "GPU 7 did not answer NVML within 5 s"
    assert all(f["severity"] == "fail" for f in timeouts.values())
    assert {f["gpu_index"] for f in findings} == set(HUNG)  # the others are fine
    # Three hung GPUs cost one 5 s deadline, not three (process start-up is the same in both).
    print(f"health: {healthy_wall:.1f} s healthy, {wall:.1f} s with {len(HUNG)} hung GPUs")
    assert wall - healthy_wall < NVML_TIMEOUT_S + 3.0  # one deadline; three would be 15 s


@pytest.mark.parametrize("command", ["status", "inventory", "doctor"])
def test_reading_commands_name_the_hung_gpus_and_finish(tmp_path: Path, command: str) -> None:
    _, doc, wall = _gpufleet(command, "--sim", _fleet(tmp_path, HUNG))
    assert _said(doc) == set(HUNG)
    print(f"{command}: {wall:.1f} s")


def test_validate_level_1_fails_the_hung_gpus(tmp_path: Path) -> None:
    code, doc, _ = _gpufleet("validate", "--sim", _fleet(tmp_path, HUNG), "--level", "1")
    assert code != 0 and doc["status"] == "fail"
    health = {r["gpu"]: r for r in doc["results"] if r["test"] == "health_rules"}
    assert {g for g, r in health.items() if r["status"] == "fail"} == set(HUNG)
    assert "GPU 5 did not answer NVML within 5 s" in health[5]["message"]
