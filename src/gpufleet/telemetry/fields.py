"""Field groups: which `Sample` fields each sampling tier stores, one ring-buffer column each.

The fast tier holds the cheap fields (one batched NVML field-values call plus a few getters,
~28 us of CPU per GPU on an H200: ``tests/fixtures/nvidia-h200/gpm_probe.json`` ``fast_sweep``)
and the GPM profiling ratios; the slow tier the expensive ones (energy counter 3-4 ms, PCIe
counters ~380 us each: ``nvml_probe.json``). Booleans become 0/1 and ``None`` becomes NaN.
"""

from __future__ import annotations

import math

import numpy as np

from gpufleet.devices.types import Sample

# GPM profiling metrics kept in ``Sample.extra`` under these keys (DCGM_FI_PROF_* semantics:
# ratios 0..1, PCIe in bytes per second). Source: NVIDIA/dcgm-exporter etc/dcp-metrics-included.csv.
PROF_COLUMNS: tuple[str, ...] = (
    "prof_gr_engine_active",
    "prof_pipe_tensor_active",
    "prof_dram_active",
    "prof_pcie_tx_bytes",
    "prof_pcie_rx_bytes",
)

FAST_COLUMNS: tuple[str, ...] = (
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_free_bytes",
    "mem_reserved_bytes",
    "gpu_temp_c",
    "mem_temp_c",
    "power_w",
    "power_instant_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remap_pending",
    "remap_failure",
    *PROF_COLUMNS,
)

SLOW_COLUMNS: tuple[str, ...] = (
    "energy_mj",
    "pcie_replay_count",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_flit_errors",
    "nvlink_bandwidth_kib",
    "power_violation_us",
    "thermal_violation_us",
    "enc_util_pct",
    "dec_util_pct",
)

_PROF_SET = frozenset(PROF_COLUMNS)


def _num(value: object) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)  # type: ignore[arg-type]


def sample_row(sample: Sample, columns: tuple[str, ...]) -> np.ndarray:
    """The sample's values for ``columns`` as one float64 row (NaN where unsupported)."""
    row = np.empty(len(columns), dtype=np.float64)
    extra = sample.extra
    for i, name in enumerate(columns):
        if name in _PROF_SET:
            row[i] = _num(extra.get(name))
        else:
            row[i] = _num(getattr(sample, name))
    return row
