"""Locked SM clocks through NVML, as a mixin of `NvmlBackend` (the power tuner's second knob).

``nvmlDeviceGetSupportedMemoryClocks`` / ``nvmlDeviceGetSupportedGraphicsClocks(mem)`` list the
clocks a GPU accepts; ``nvmlDeviceSetGpuLockedClocks(min, max)`` holds the graphics clock in that
range (root only, Volta and newer; the power cap and thermal protection still apply);
``nvmlDeviceResetGpuLockedClocks`` returns it to the driver default. A lock lasts until reset,
a reboot or a driver reload, and NVML has no call that reads a lock back, so a sweep resets
rather than "restores". Source: NVML API Reference, "Device Commands" and "Device Queries"
(docs.nvidia.com/deploy/nvml-api/).
"""

from __future__ import annotations

from typing import Any

from gpufleet.devices.nvml.errors import error_name
from gpufleet.errors import DeviceError


class ClockControl:
    """``supported_graphics_clocks_mhz``, ``lock_gpu_clocks_mhz`` and ``reset_gpu_clocks`` for a
    backend that provides ``_lib``, ``_handle``, ``_ensure_init``, ``call`` and ``node_name``."""

    _lib: Any
    node_name: str
    nvml_calls: int

    def call(self, fn: str, *args: Any, gpu: int | None = None, variant: str | None = None) -> Any:
        raise NotImplementedError

    def _handle(self, index: int) -> Any:
        raise NotImplementedError

    def _ensure_init(self) -> None:
        raise NotImplementedError

    def supported_graphics_clocks_mhz(self, index: int) -> list[int] | None:
        """Graphics clocks at the highest supported memory clock, highest first; None when
        NVML does not say (NotSupported, an older driver)."""
        handle = self._handle(index)
        mems = self.call("nvmlDeviceGetSupportedMemoryClocks", handle, gpu=index)
        if not mems:
            return None
        clocks = self.call(
            "nvmlDeviceGetSupportedGraphicsClocks", handle, max(int(m) for m in mems), gpu=index
        )
        return sorted({int(c) for c in clocks}, reverse=True) if clocks else None

    def _clock_command(self, index: int, what: str, fn: str, *args: int) -> None:
        self._ensure_init()
        handle = self._handle(index)
        self.nvml_calls += 1
        lib = self._lib
        where = f"GPU {index} on {self.node_name}"
        try:
            getattr(lib, fn)(handle, *args)
        except lib.NVMLError as exc:
            code = int(exc.value)
            if code == lib.NVML_ERROR_NO_PERMISSION:
                raise DeviceError(
                    f"{where}: {what} needs root (NVML_ERROR_NO_PERMISSION)",
                    hint="run as root, or with sudo",
                ) from exc
            if code == lib.NVML_ERROR_NOT_SUPPORTED:
                raise DeviceError(
                    f"{where}: this GPU does not support locked clocks (Volta and newer do; "
                    "NVML_ERROR_NOT_SUPPORTED)"
                ) from exc
            if code == lib.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise DeviceError(
                    f"{where}: {fn} is not in this NVML library (driver too old?)"
                ) from exc
            if code == lib.NVML_ERROR_INVALID_ARGUMENT:
                raise DeviceError(
                    f"{where}: {what}: {'-'.join(map(str, args))} MHz is not a valid clock range"
                    " (see `nvidia-smi -q -d SUPPORTED_CLOCKS`)"
                ) from exc
            raise DeviceError(f"{where}: {what} failed: {exc} ({error_name(code)})") from exc

    def lock_gpu_clocks_mhz(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """Lock the graphics clock to ``min_mhz``-``max_mhz``; a DeviceError when refused."""
        self._clock_command(
            index, "locking clocks", "nvmlDeviceSetGpuLockedClocks", int(min_mhz), int(max_mhz)
        )

    def reset_gpu_clocks(self, index: int) -> None:
        """Unlock the graphics clock (driver default); a DeviceError when refused."""
        self._clock_command(index, "resetting locked clocks", "nvmlDeviceResetGpuLockedClocks")
