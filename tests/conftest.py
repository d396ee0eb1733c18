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
