"""The same backend checks against real NVML (pynvml). Marked `gpu`: skipped without a GPU.

Read-only: nothing here changes a GPU setting.
"""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from gpufleet.devices.nvml import NvmlBackend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    b = NvmlBackend(lib=pynvml, node_name="local")
    yield b
    b.close()


def test_real_identity(backend: NvmlBackend) -> None:
    assert backend.device_count() >= 1
    info = backend.device_info(0)
    assert info.uuid.startswith(("GPU-", "MIG-"))
    assert info.memory_total_bytes and info.memory_total_bytes > 1 << 30
    assert (
        info.driver_version
        and info.nvml_version
        and info.nvml_version.endswith(info.driver_version)
    )
    assert info.pcie_gen_max and info.pcie_width_max


def test_real_sample_has_the_fast_fields(backend: NvmlBackend) -> None:
    s = backend.sample(0)
    assert s.power_w is not None and 10 < s.power_w < 1500
    assert s.gpu_temp_c is not None and 0 < s.gpu_temp_c < 110
    assert s.sm_clock_mhz is not None and s.sm_clock_mhz > 0
    assert s.mem_used_bytes is not None and s.mem_free_bytes is not None
    assert s.clock_event_reasons is not None
    assert s.energy_mj is not None and s.energy_mj > 0


def test_real_h200_matches_the_fixture_identity(backend: NvmlBackend) -> None:
    info = backend.device_info(0)
    if info.name != "NVIDIA H200":
        pytest.skip("not an H200")
    assert info.model == "h200-sxm"
    assert info.memory_total_bytes == 143771 * 2**20
    assert info.power_limit_max_w == 700


def test_real_events_poll_does_not_block(backend: NvmlBackend) -> None:
    events = backend.poll_events(timeout_ms=10)
    assert all(e.kind in ("xid", "gpu_lost") for e in events)
