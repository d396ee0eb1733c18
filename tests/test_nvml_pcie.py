"""PCIe throughput under load survives the 32-bit byte counters wrapping (issue 14 item 13).

The H200's PCIe TX/RX byte counters (field ids 197/198) are 32-bit unsigned ints
(``tests/fixtures/nvidia-h200/nvml_probe.json``: valueType 1): at the measured 55.5 GB/s pinned
copies they wrap every ~0.08 s, so a rate from two readings a slow-tier interval apart is noise.
The simulator's counters wrap the same way; the backend reads NVML's throughput getter.
"""

from __future__ import annotations

import itertools

import pynvml
import pytest

from gpufleet.devices.sim import Load, ManualClock, SimFleet, parse_fleet_spec

RATE = 55.5e9  # load_trace.json: pinned host-to-device copies on the H200


def test_simulated_counters_wrap_at_32_bits_and_the_rate_survives() -> None:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x1xh200"), clock=clock)
    node = next(iter(fleet.nodes.values()))
    node.gpus[0].run(Load(util=0.3, pcie_tx_bytes_per_s=RATE, pcie_rx_bytes_per_s=RATE / 2))
    lib = node.nvml
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    raw = []
    for _ in range(3):
        clock.advance(10)
        fv = lib.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])[0]
        assert fv.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        raw.append(int(fv.value.uiVal))
    assert all(0 <= v < 2**32 for v in raw)
    naive = [(b - a) / 10 for a, b in itertools.pairwise(raw)]
    assert all(abs(r - RATE) > 0.5 * RATE for r in naive)  # the wrapped delta is meaningless
    backend = node.backend()
    try:
        backend.sample_slow(0)
        clock.advance(10)
        s = backend.sample_slow(0)
    finally:
        backend.close()
    assert s.pcie_tx_bytes_per_s == pytest.approx(RATE, rel=0.01)
    assert s.pcie_rx_bytes_per_s == pytest.approx(RATE / 2, rel=0.01)
