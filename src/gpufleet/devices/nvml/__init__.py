"""The NVML backend: production code over nvidia-ml-py, or over the simulator (same API)."""

from gpufleet.devices.nvml.backend import NvmlBackend, load_pynvml

__all__ = ["NvmlBackend", "load_pynvml"]
