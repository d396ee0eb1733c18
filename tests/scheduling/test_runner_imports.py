"""The per-job fencing wrapper starts light: one runs per job copy, and importing the embedded
scheduler's engine with it (SQLAlchemy, the store) cost each job start most of a second of CPU
(seen as load in the chaos test, where dozens of copies start at once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.process
def test_the_job_wrapper_imports_no_database_layer() -> None:
    code = (
        "import sys, gpufleet.schedulers.embedded.runner\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'gpufleet.schedulers.embedded.engine', "
        "'gpufleet.schedulers.embedded.store', 'httpx') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_the_package_names_still_load_on_use() -> None:
    from gpufleet.schedulers import embedded

    assert embedded.LocalProcessExecutor.__name__ == "LocalProcessExecutor"
    assert embedded.JobStore.__module__ == "gpufleet.schedulers.embedded.store"
    assert set(embedded.__all__) <= set(dir(embedded)) | set(embedded._MODULE)
