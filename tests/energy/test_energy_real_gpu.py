"""On a real GPU, only read: the energy counter, and a sweep of one at the current limit, which
must never call NVML's set-limit function (shared machines: no setting is ever changed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.energy.sweep import sweep
from gpufleet.energy.workloads import CommandRunner

pytestmark = pytest.mark.gpu
SRC = Path(__file__).resolve().parents[2] / "src"


class NoSetting:
    """pynvml, with every set call refused loudly (the test fails if one is made)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.set_calls = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlDeviceSet"):
            self.set_calls += 1
            raise AssertionError(f"{name} called on a real GPU")
        return getattr(self._lib, name)


def _backend() -> tuple[Any, NoSetting]:
    import pynvml

    from gpufleet.devices.nvml.backend import NvmlBackend

    lib = NoSetting(pynvml)
    return NvmlBackend(lib=lib), lib


def test_energy_counter_reads_and_does_not_go_backwards() -> None:
    backend, lib = _backend()
    first = backend.total_energy_mj(0)
    time.sleep(0.5)
    second = backend.total_energy_mj(0)
    if first is None:
        assert second is None  # unsupported stays unsupported, never 0
    else:
        assert second is not None and second >= first
    assert backend.power_limit_w(0) is None or backend.power_limit_w(0) > 0
    assert lib.set_calls == 0
    backend.close()


def test_sweep_at_current_limit_sets_nothing() -> None:
    backend, lib = _backend()
    limit = backend.power_limit_w(0)
    code = "import time; [print(f'rate {i}.0', flush=True) or time.sleep(0.2) for i in range(1, 6)]"
    runner = CommandRunner(f'{sys.executable} -c "{code}"', r"rate ([0-9.]+)", "units/s")
    result = sweep(backend, [0], None, runner, 3.0)
    assert lib.set_calls == 0
    assert len(result.points) == 1 and result.points[0].limit_w == limit
    assert result.points[0].energy_j is None or result.points[0].energy_j >= 0
    assert backend.power_limit_w(0) == limit
    backend.close()


def test_cli_sweep_current_leaves_the_limit_alone() -> None:
    backend, _lib = _backend()
    before = backend.power_limit_w(0)
    code = "print('rate 1.5')"
    env = {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "power", "sweep", "--limits", "CURRENT", "--gpus", "0",
         "--seconds", "2", "--workload", f'{sys.executable} -c "{code}"',
         "--rate-regex", r"rate ([0-9.]+)", "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["points"][0]["limit_w"] == before and doc["restored"] is True
    assert backend.power_limit_w(0) == before
    backend.close()


def test_cli_builtin_matmul_sweep_at_current_limit() -> None:
    """The built-in load generator (PyTorch) measured at the limit in force."""
    pytest.importorskip("torch")
    backend, _lib = _backend()
    before = backend.power_limit_w(0)
    env = {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "power", "sweep", "--limits", "CURRENT", "--gpus", "0",
         "--seconds", "8", "--workload", "matmul-bf16", "--json"],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    point = json.loads(done.stdout)["points"][0]
    assert point["unit"] == "TFLOP/s" and point["throughput"] > 10
    assert backend.power_limit_w(0) == before
    backend.close()
