"""Shared fixtures; `gpu`-marked tests skip cleanly where NVML finds no GPU."""

from __future__ import annotations

import functools
import os
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


# pytest-xdist's workers get COLUMNS=80 and LINES=24 in their environment; Rich reads COLUMNS
# once, when the CLI's console is made, which would fix every table at 80 columns whatever a
# test asks for. The CLI tests set COLUMNS per invocation, as a serial run leaves them free to.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if real_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def h200_dir() -> Path:
    return H200
