"""What ``inventory --import`` shows of an imported report beyond the GPU identity: the
readings at capture time, MIG devices, clock-event reason counters and what needs attention."""

from __future__ import annotations

from typing import Any

from gpufleet.devices.smi.importer import ImportResult
from gpufleet.devices.smi.xml_report import SmiGpu
from gpufleet.devices.types import ClockEventReason, DeviceInfo, Sample, decode_clock_reasons

# Reasons that mean the hardware held the clocks down (not idle, not a setting): HW slowdown,
# HW thermal slowdown, HW power brake, SW thermal slowdown (nvmlClocksEventReason*, NVML API
# Reference "Clocks Event Reasons").
_HELD_DOWN = (
    ClockEventReason.HW_SLOWDOWN
    | ClockEventReason.HW_THERMAL_SLOWDOWN
    | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    | ClockEventReason.SW_THERMAL_SLOWDOWN
)
THERMAL_MARGIN_C = 5  # flag a GPU this close to its slowdown temperature


def attention(info: DeviceInfo, sample: Sample | None) -> list[str]:
    """What an operator should look at on this GPU, in words (empty when nothing)."""
    out: list[str] = []
    if info.persistence_mode is False:
        out.append("persistence mode off (nvidia-smi -pm 1)")
    if info.ecc_current is False:
        out.append("ECC off")
    if info.mig_pending is not None and info.mig_pending != info.mig_current:
        out.append("MIG mode change pending a GPU reset")
    if sample is None:
        return out
    if sample.clock_event_reasons is not None and sample.clock_event_reasons & int(_HELD_DOWN):
        words = decode_clock_reasons(sample.clock_event_reasons & int(_HELD_DOWN))
        out.append("clocks held down: " + ", ".join(words))
    if (
        sample.gpu_temp_c is not None
        and info.slowdown_temp_c is not None
        and sample.gpu_temp_c >= info.slowdown_temp_c - THERMAL_MARGIN_C
    ):
        out.append(f"GPU at {sample.gpu_temp_c:.0f} C, slowdown at {info.slowdown_temp_c} C")
    return out


def _reading(gpu: SmiGpu) -> dict[str, Any]:
    s, info = gpu.sample, gpu.info
    return {
        "power_w": s.power_w,
        "power_instant_w": s.power_instant_w,
        "power_limit_w": info.power_limit_enforced_w,
        "power_limit_default_w": info.power_limit_default_w,
        "gpu_util_pct": s.gpu_util_pct,
        "mem_util_pct": s.mem_util_pct,
        "mem_used_bytes": s.mem_used_bytes,
        "sm_clock_mhz": s.sm_clock_mhz,
        "mem_clock_mhz": s.mem_clock_mhz,
        "max_sm_clock_mhz": info.max_sm_clock_mhz,
        "gpu_temp_c": s.gpu_temp_c,
        "mem_temp_c": s.mem_temp_c,
        "slowdown_temp_c": info.slowdown_temp_c,
        "shutdown_temp_c": info.shutdown_temp_c,
        "clock_event_reasons": s.clock_event_reasons,
        "clock_event_reasons_words": decode_clock_reasons(s.clock_event_reasons),
    }


def gpu_details(gpu: SmiGpu) -> dict[str, Any]:
    """The extra JSON keys of one imported GPU."""
    return {
        "reading": _reading(gpu),
        "clock_event_counters_us": dict(gpu.clock_event_counters_us),
        "mig_devices": [
            {
                "index": m.index,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "profile": m.profile_name,
                "sm_count": m.sm_count,
                "memory_total_bytes": m.memory_total_bytes,
                "memory_used_bytes": m.memory_used_bytes,
                "placement": None
                if m.placement_start is None
                else {"start": m.placement_start, "size": m.placement_size},
            }
            for m in gpu.mig_devices
        ],
        "attention": attention(gpu.info, gpu.sample),
    }


def import_details(result: ImportResult | None) -> dict[tuple[str, int], dict[str, Any]]:
    """``gpu_details`` of every imported GPU, by (node name, GPU index)."""
    if result is None:
        return {}
    return {
        (node.name, gpu.info.index): gpu_details(gpu)
        for node in result.nodes
        for gpu in node.report.gpus
    }
