"""Telemetry: field groups, the two-tier sampler, numeric ring buffers, the metric registry with
dcgm-exporter's names, and the Prometheus exposition built from the ring buffers."""

from gpufleet.telemetry.fields import FAST_COLUMNS, PROF_COLUMNS, SLOW_COLUMNS, sample_row
from gpufleet.telemetry.ring import RingBuffer
from gpufleet.telemetry.sampler import GpuState, Sampler, TickResult

__all__ = [
    "FAST_COLUMNS",
    "PROF_COLUMNS",
    "SLOW_COLUMNS",
    "GpuState",
    "RingBuffer",
    "Sampler",
    "TickResult",
    "sample_row",
]
