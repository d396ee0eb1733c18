"""The metric registry: every exported metric with dcgm-exporter's name, type, help and unit.

Names, types, help texts and units follow dcgm-exporter's default counter set,
``etc/default-counters.csv`` and ``etc/dcp-metrics-included.csv`` in
https://github.com/NVIDIA/dcgm-exporter (FB in MiB, power in W, energy in mJ, temperatures
in C, clocks in MHz, utilization in %, violations in us, DCGM_FI_PROF_* as ratios 0..1 and PCIe
bytes per second). Labels follow its GPU render template
(``internal/pkg/rendermetrics``): ``gpu, UUID, pci_bus_id, device, modelName``, then
``GPU_I_PROFILE, GPU_I_ID`` on MIG instances, then ``Hostname``, then attribute labels such as
``DCGM_FI_DRIVER_VERSION``.

MIG (docs/mig-and-kubernetes.md, "Metrics on MIG GPUs"): an instance-scoped metric (``mig``:
framebuffer, profiling ratios) has one series per GPU instance, labelled ``GPU_I_PROFILE`` and
``GPU_I_ID``, and no whole-GPU series while instances report it, so ``sum by (UUID)`` counts
each byte once; a device-scoped metric (temperature, power, clocks, energy, ECC, PCIe) has one
whole-GPU series and is not repeated per instance (dcgm-exporter repeats it, which makes
sums over instances count the GPU's power once per instance: NVIDIA/dcgm-exporter issues
#257 and #317). A metric NVML does not supply on a MIG-enabled GPU (``mig_unsupported``:
``nvmlDeviceGetUtilizationRates``, "On MIG-enabled GPUs, querying device utilization rates is
not currently supported", NVML API Reference) is absent there, not 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DCGM_SOURCE = "NVIDIA/dcgm-exporter etc/default-counters.csv, etc/dcp-metrics-included.csv"
MIB = 2**20

GPU_LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
MIG_LABELS: tuple[str, ...] = ("GPU_I_PROFILE", "GPU_I_ID")
HOST_LABEL = "Hostname"
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"


@dataclass(frozen=True)
class MetricDef:
    """One dcgm-exporter metric read from one ring-buffer column."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    tier: Literal["fast", "slow"]
    column: str
    scale: float = 1.0
    floor: bool = False  # dcgm-exporter reports whole units (MiB) for these
    mig: bool = False  # exported per MIG instance (instance-scoped in DCGM)
    mig_unsupported: bool = False  # NVML does not supply it on a MIG-enabled GPU


def _g(
    name: str, help_: str, tier: Literal["fast", "slow"], column: str, **kw: object
) -> MetricDef:
    return MetricDef(name, "gauge", help_, tier, column, **kw)  # type: ignore[arg-type]


def _c(name: str, help_: str, tier: Literal["fast", "slow"], column: str) -> MetricDef:
    return MetricDef(name, "counter", help_, tier, column)


DCGM_METRICS: tuple[MetricDef, ...] = (
    _g("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "fast", "sm_clock_mhz"),
    _g("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "fast", "mem_clock_mhz"),
    _g("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "fast", "mem_temp_c"),
    _g("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "fast", "gpu_temp_c"),
    # DCGM_FI_DEV_POWER_USAGE is NVML's 1 s average (what nvmlDeviceGetPowerUsage returns on
    # Ampere and newer, NVML_FI_DEV_POWER_AVERAGE); the instant reading has its own field.
    _g("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "fast", "power_w"),
    _g(
        "DCGM_FI_DEV_POWER_USAGE_INSTANT",
        "Current instantaneous power usage of the device (in W).",
        "fast",
        "power_instant_w",
    ),
    _c(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "slow",
        "energy_mj",
    ),
    _c(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        "slow",
        "pcie_replay_count",
    ),
    _g(
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        "fast",
        "gpu_util_pct",
        mig_unsupported=True,
    ),
    _g(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        "fast",
        "mem_util_pct",
        mig_unsupported=True,
    ),
    _g("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "slow", "enc_util_pct"),
    _g("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "slow", "dec_util_pct"),
    _g(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        "fast",
        "mem_free_bytes",
        scale=1 / MIB,
        floor=True,
        mig=True,
    ),
    _g(
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        "fast",
        "mem_used_bytes",
        scale=1 / MIB,
        floor=True,
        mig=True,
    ),
    _g(
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        "fast",
        "mem_reserved_bytes",
        scale=1 / MIB,
        floor=True,
    ),
    _c(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        "fast",
        "ecc_sbe_volatile",
    ),
    _c(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        "fast",
        "ecc_dbe_volatile",
    ),
    # NVLink (dcgm-exporter etc/default-counters.csv names; NVML totals over every link, the
    # bandwidth counter is NVML's data payload TX + RX summed over the links, in KiB).
    _c(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "Total number of NVLink flow-control CRC errors.",
        "slow",
        "nvlink_crc_flit_errors",
    ),
    _c(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "Total number of NVLink data CRC errors.",
        "slow",
        "nvlink_crc_errors",
    ),
    _c(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        "slow",
        "nvlink_replay_errors",
    ),
    _c(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        "slow",
        "nvlink_recovery_errors",
    ),
    _c(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "Total number of NVLink bandwidth counters for all lanes",
        "slow",
        "nvlink_bandwidth_kib",
    ),
    _c(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        "slow",
        "ecc_sbe_aggregate",
    ),
    _c(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        "slow",
        "ecc_dbe_aggregate",
    ),
    _c(
        "DCGM_FI_DEV_RETIRED_SBE",
        "Total number of retired pages due to single-bit errors.",
        "slow",
        "retired_pages_sbe",
    ),
    _c(
        "DCGM_FI_DEV_RETIRED_DBE",
        "Total number of retired pages due to double-bit errors.",
        "slow",
        "retired_pages_dbe",
    ),
    _c(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "Throttling duration due to power constraints (in us).",
        "slow",
        "power_violation_us",
    ),
    _c(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "Throttling duration due to thermal constraints (in us).",
        "slow",
        "thermal_violation_us",
    ),
    _c(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        "fast",
        "remapped_rows_uncorrectable",
    ),
    _c(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        "fast",
        "remapped_rows_correctable",
    ),
    _g(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        "fast",
        "remap_failure",
    ),
    _g(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        "fast",
        "prof_gr_engine_active",
        mig=True,
    ),
    _g(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "fast",
        "prof_pipe_tensor_active",
        mig=True,
    ),
    _g(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "fast",
        "prof_dram_active",
        mig=True,
    ),
    _g(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers "
        "and data payloads - in bytes per second.",
        "fast",
        "prof_pcie_tx_bytes",
    ),
    _g(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers "
        "and data payloads - in bytes per second.",
        "fast",
        "prof_pcie_rx_bytes",
    ),
)

XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
XID_GAUGE_HELP = "Value of the last XID error encountered."

# Columns a MIG instance's own ring buffer holds (instance-scoped fields).
MIG_COLUMNS: tuple[str, ...] = tuple(m.column for m in DCGM_METRICS if m.mig)

# gpufleet's own metrics.
GPU_HEALTH = "gpufleet_gpu_health_status"
NODE_HEALTH = "gpufleet_node_health_status"
XID_COUNTER = "gpufleet_xid_errors"  # samples are gpufleet_xid_errors_total{xid="..."}
CLOCK_REASON = "gpufleet_clock_event_reason_active"
GPU_STALLED = "gpufleet_gpu_stalled"
GPU_LOST = "gpufleet_gpu_lost"
NVML_ERRORS = "gpufleet_agent_nvml_errors"
SAMPLE_DURATION = "gpufleet_agent_sample_duration_seconds"
TICKS = "gpufleet_agent_sample_rounds"
SAMPLE_SECONDS = "gpufleet_agent_sample_seconds"
BUFFER_DEPTH = "gpufleet_agent_buffer_depth"
