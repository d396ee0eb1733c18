"""Shared fixtures; `gpu`-marked tests skip cleanly where NVML finds no GPU."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "nvidia-h200"


@functools.cache
def real_gpu_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


# Test files that start a Slurm dev cluster: under pytest-xdist (`make test`) they run on one
# worker (`--dist loadgroup`), so the session's cluster starts once, not once per worker.
SLURM_FILES = (
    "tests/slurm/",
    "tests/integration/test_slurm.py",
    "tests/integration/test_campaign_slurm.py",
    "tests/validate/test_multinode.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = item.nodeid.split("::", 1)[0]
        if where.startswith(SLURM_FILES):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if real_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def h200_dir() -> Path:
    return H200
