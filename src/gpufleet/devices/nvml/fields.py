"""Which NVML fields gpufleet reads, in which tier, and how each becomes a `Sample` field.

Costs measured on an H200 (``tests/fixtures/nvidia-h200/nvml_probe.json``): most field ids and
getters take 2-50 us; the energy counter 3-4 ms; PCIe error/byte counters and the replay
counter ~380 us each; ``nvmlDeviceGetPcieThroughput`` ~20 ms (it samples for 20 ms). The fast
tier is one batched ``nvmlDeviceGetFieldValues`` call of cheap ids plus six cheap getters (~28 us
of CPU per GPU on the H200, ``gpm_probe.json`` ``fast_sweep``); everything expensive waits for
the slow tier, as do the NVLink counters (totals, then one batched call of every link's state,
error counters and throughput, field values scoped by link; on the single H200 captured every
NVLink field answers NotSupported in 10-56 us).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

# field id -> (Sample attribute, scale). Scale converts NVML units to ours.
FAST_FIELDS: dict[int, tuple[str, float]] = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("ecc_sbe_volatile", 1),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("ecc_dbe_volatile", 1),
    pynvml.NVML_FI_DEV_MEMORY_TEMP: ("mem_temp_c", 1),
    pynvml.NVML_FI_DEV_REMAPPED_COR: ("remapped_rows_correctable", 1),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: ("remapped_rows_uncorrectable", 1),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: ("remap_pending", 1),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: ("remap_failure", 1),
    # dcgm-exporter's DCGM_FI_DEV_POWER_USAGE is the 1 s average (NVML API Reference,
    # nvmlDeviceGetPowerUsage: averaged over 1 s on Ampere and newer); the instantaneous
    # reading is DCGM_FI_DEV_POWER_USAGE_INSTANT.
    pynvml.NVML_FI_DEV_POWER_AVERAGE: ("power_w", 1e-3),
    pynvml.NVML_FI_DEV_POWER_INSTANT: ("power_instant_w", 1e-3),
}

SLOW_FIELDS: dict[int, tuple[str, float]] = {
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: ("energy_mj", 1),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("pcie_replay_count", 1),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("ecc_sbe_aggregate", 1),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("ecc_dbe_aggregate", 1),
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: ("nvlink_crc_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: ("nvlink_replay_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: ("nvlink_recovery_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: ("nvlink_crc_flit_errors", 1),
    pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: ("_nvlink_link_count", 1),
    # Violation times in ns: the successors of nvmlDeviceGetViolationStatus (deprecated).
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: ("_power_violation_ns", 1),
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: ("_thermal_violation_ns", 1),
}

BOOL_FIELDS = frozenset({"remap_pending", "remap_failure"})
INT_FIELDS = frozenset(
    {
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "energy_mj",
        "pcie_replay_count",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "nvlink_crc_errors",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
        "nvlink_crc_flit_errors",
    }
)

# Per-link NVLink fields, read with ``scopeId`` = link number (NVML API Reference, "Field Value
# Enums": NVML_FI_DEV_NVLINK_GET_STATE 0=inactive 1=active, NVML_FI_DEV_NVLINK_ERROR_DL_CRC /
# _REPLAY / _RECOVERY per-link data-link error counters, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX /
# _RX data payload in KiB). Attribute names are those of `gpufleet.devices.types.NvLinkCounters`.
NVLINK_LINK_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: "active",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc_errors",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay_errors",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery_errors",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx_kib",
}
NVLINK_MAX_LINKS = 18  # Hopper and Blackwell GPUs have 18 NVLinks (NVIDIA H100/B200 datasheets)


class RawFieldValue(ctypes.Structure):
    """``c_nvmlFieldValue_t``'s C layout without pynvml's Python attribute hooks (its
    ``_PrintableStructure`` runs Python code on every read and write of a member). A slow
    sample reads 18 links x 6 fields of every GPU: read through this view, the members are
    plain ctypes descriptors."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


def _typed(ret: int, vtype: int, v: Any) -> float | int | None:
    if ret != pynvml.NVML_SUCCESS:
        return None
    if vtype == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.uiVal)
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.ulVal)
    if vtype == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.sllVal)
    if vtype == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.siVal)
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return int(v.usVal)
    return int(v.ullVal)


def field_value(fv: object) -> float | int | None:
    """The value of one ``c_nvmlFieldValue_t`` by its value type; None when not successful."""
    ret = getattr(fv, "nvmlReturn", 1)
    if ret != pynvml.NVML_SUCCESS:
        return None
    return _typed(ret, getattr(fv, "valueType", None), fv.value)  # type: ignore[attr-defined,arg-type]


def field_values(values: Any) -> list[float | int | None]:
    """`field_value` of each entry of what ``nvmlDeviceGetFieldValues`` returned: an array of
    ``c_nvmlFieldValue_t`` is read through `RawFieldValue` (the same bytes), anything else
    entry by entry."""
    if isinstance(values, ctypes.Array) and values._type_ is pynvml.c_nvmlFieldValue_t:
        raw = (RawFieldValue * len(values)).from_buffer(values)
        return [_typed(r.nvmlReturn, r.valueType, r.value) for r in raw]
    return [field_value(fv) for fv in values]
