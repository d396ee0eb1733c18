"""Device-layer records: what a GPU is (`DeviceInfo`), what it reads now (`Sample`), what happened
(`GpuEvent`). Frozen, with units in field names; ``None`` where the GPU does not support a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag

from gpufleet.devices.host import HostTopology


class ClockEventReason(IntFlag):
    """NVML clock-event (throttle) reasons (``nvmlClocksEventReason*``, once ``*ThrottleReason*``).

    Source: NVML API Reference, "Clocks Event Reasons" (docs.nvidia.com/deploy/nvml-api/).
    """

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


CLOCK_REASON_WORDS: dict[ClockEventReason, str] = {
    ClockEventReason.GPU_IDLE: "idle",
    ClockEventReason.APPLICATIONS_CLOCKS_SETTING: "app clocks",
    ClockEventReason.SW_POWER_CAP: "SW power cap",
    ClockEventReason.HW_SLOWDOWN: "HW slowdown",
    ClockEventReason.SYNC_BOOST: "sync boost",
    ClockEventReason.SW_THERMAL_SLOWDOWN: "SW thermal",
    ClockEventReason.HW_THERMAL_SLOWDOWN: "HW thermal",
    ClockEventReason.HW_POWER_BRAKE_SLOWDOWN: "HW power brake",
    ClockEventReason.DISPLAY_CLOCK_SETTING: "display clocks",
}


def decode_clock_reasons(mask: int | None) -> list[str]:
    """The clock-event bitmask in words, e.g. ``0x4`` -> ``["SW power cap"]``."""
    if mask is None:
        return []
    return [word for bit, word in CLOCK_REASON_WORDS.items() if mask & bit]


@dataclass(frozen=True)
class DeviceInfo:
    """Identity and configuration of one GPU (changes rarely)."""

    index: int
    uuid: str
    name: str
    model: str | None = None  # catalog key, e.g. "h200-sxm"
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    inforom_version: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    host: HostTopology | None = None  # CPUs and memory (real hosts only: gpufleet.devices.host)
    nvml_version: str | None = None
    memory_total_bytes: int | None = None
    power_limit_default_w: float | None = None
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    power_limit_enforced_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    persistence_mode: bool | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    compute_mode: str | None = None
    slowdown_temp_c: int | None = None
    shutdown_temp_c: int | None = None
    minor_number: int | None = None


@dataclass(frozen=True)
class NvLinkCounters:
    """One NVLink of one GPU (NVML field values scoped by link: ``NVML_FI_DEV_NVLINK_GET_STATE``,
    ``..._ERROR_DL_CRC``/``_REPLAY``/``_RECOVERY``, ``..._THROUGHPUT_DATA_TX``/``_RX`` in KiB).
    Counters are cumulative; None where NVML does not supply the value."""

    link: int
    active: bool | None = None
    crc_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    tx_kib: int | None = None
    rx_kib: int | None = None


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU. Counters are cumulative; rates are computed by consumers."""

    timestamp_s: float
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_free_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    gpu_temp_c: float | None = None
    mem_temp_c: float | None = None
    power_w: float | None = None  # 1 s average (DCGM_FI_DEV_POWER_USAGE)
    power_instant_w: float | None = None  # instantaneous (DCGM_FI_DEV_POWER_USAGE_INSTANT)
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    pcie_replay_count: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    nvlink_crc_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    nvlink_crc_flit_errors: int | None = None
    nvlink_bandwidth_kib: int | None = None  # TX + RX data over every link, cumulative
    nvlink_links: tuple[NvLinkCounters, ...] | None = None  # per link (slow tier)
    power_violation_us: int | None = None
    thermal_violation_us: int | None = None
    enc_util_pct: float | None = None
    dec_util_pct: float | None = None
    extra: dict[str, float] = field(default_factory=dict)  # e.g. GPM profiling metrics

    def merged(self, other: Sample) -> Sample:
        """This sample with every field that ``other`` has (not None) taken from ``other``."""
        from dataclasses import fields, replace

        updates = {
            f.name: getattr(other, f.name)
            for f in fields(other)
            if f.name not in ("timestamp_s", "extra") and getattr(other, f.name) is not None
        }
        extra = {**self.extra, **other.extra}
        return replace(self, **updates, extra=extra)


@dataclass(frozen=True)
class GpuEvent:
    """Something that happened on a GPU: an XID (with code) or a lost device."""

    gpu_index: int
    gpu_uuid: str | None
    kind: str  # "xid", "gpu_lost", "ecc_dbe", ...
    timestamp_s: float
    xid: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class NodeInventory:
    """One node's GPUs as the device layer sees them, with where they came from."""

    name: str
    gpus: tuple[DeviceInfo, ...]
    source: str = "nvml"  # "nvml", "sim", or the imported file's path
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    host: HostTopology | None = None  # CPUs and memory (real hosts only: gpufleet.devices.host)
