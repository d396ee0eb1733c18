"""The suite's guard against controller services left running (tests/conftest.py): a module
whose test starts a `ControlService` and never stops it fails at the module's end, naming the
cause; the same module stopping it passes. Run as a real pytest process on a planted module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.control.service import CONTROL_THREAD
from tests.conftest import CONTROL_THREAD as GUARDED

ROOT = Path(__file__).resolve().parents[1]
PLANTED = """
from gpufleet.control.service import ControlService, ServiceConfig


def test_starts_a_service(tmp_path):
    svc = ControlService(ServiceConfig(data_dir=tmp_path / "data"))
    svc.start()
    {stop}
"""


def test_the_guard_watches_the_services_thread_name() -> None:
    assert GUARDED == CONTROL_THREAD


@pytest.mark.process
@pytest.mark.parametrize("stop", [False, True])
def test_a_module_leaving_a_controller_running_fails(stop: bool, tmp_path: Path) -> None:
    # outside tests/ (no other pytest run collects it), with the suite's conftest as a plugin
    planted = tmp_path / "test_planted_leak.py"
    planted.write_text(PLANTED.format(stop="svc.stop()" if stop else "pass"), encoding="utf-8")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    out = subprocess.run(
        [*args, "--rootdir", str(tmp_path), str(planted)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)},
    )
    text = out.stdout + out.stderr
    if stop:
        assert out.returncode == 0, text
    else:
        assert out.returncode != 0, text
        assert "1 controller service(s) started by this module still run after it" in text
