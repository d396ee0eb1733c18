"""The locked-clock calls of the simulated NVML (`SimNvml` inherits them).

As NVML's "Device Commands" and "Device Queries" (NVML API Reference,
docs.nvidia.com/deploy/nvml-api/): ``nvmlDeviceSetGpuLockedClocks(min, max)`` and
``nvmlDeviceResetGpuLockedClocks`` need root (else NO_PERMISSION), work on Volta and newer (else
NOT_SUPPORTED) and refuse a range outside the supported clocks (INVALID_ARGUMENT); a lock lasts
until reset, a reboot or a driver reload. ``nvmlDeviceGetSupportedGraphicsClocks(mem)`` lists the
graphics clocks for a memory clock, highest first: on the H200 fixture 1980 down to 345 MHz in
15 MHz steps (tests/fixtures/nvidia-h200/nvidia-smi-q-d-supported-clocks.txt); an unknown memory
clock is NOT_FOUND. A node read from a fleet file keeps its locks for the next process
(`gpufleet.devices.sim.locks`), as a lock outlives the process that set it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from gpufleet.devices.sim import physics as ph

if TYPE_CHECKING:
    from gpufleet.devices.sim.fleet import SimNode
    from gpufleet.devices.sim.gpu import SimGpu
    from gpufleet.devices.sim.nvml_api import SimHandle

CLOCK_STEP_MHZ = 15  # H200 fixture: supported graphics clocks 15 MHz apart
PRE_VOLTA = frozenset({"kepler", "maxwell", "pascal"})


class SimClockCalls:
    """Supported clocks and locked clocks over a simulated node (``_gpu``, ``_node``)."""

    locked_clock_calls = 0  # set/reset calls that reached a GPU (tests)
    locked_clocks_supported = True  # False: every GPU answers NOT_SUPPORTED (tests)

    if TYPE_CHECKING:
        _node: SimNode

        def _gpu(self, handle: SimHandle) -> SimGpu: ...

    def _clock_support(self, gpu: SimGpu) -> None:
        if not self.locked_clocks_supported or gpu.model.architecture in PRE_VOLTA:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetSupportedMemoryClocks(self, h: Any) -> list[int]:
        """The max memory clock only (the H200 also lists a 2201 MHz idle state)."""
        return [int(self._gpu(h).model.max_mem_clock_mhz or 2619)]

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: Any, memory_clock_mhz: int) -> list[int]:
        gpu = self._gpu(h)
        if int(memory_clock_mhz) != int(gpu.model.max_mem_clock_mhz or 2619):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        top = int(gpu.model.max_sm_clock_mhz or 1980)
        return list(range(top, ph.IDLE_SM_CLOCK_MHZ - 1, -CLOCK_STEP_MHZ))

    def nvmlDeviceSetGpuLockedClocks(self, h: Any, min_mhz: int, max_mhz: int) -> None:
        gpu = self._gpu(h)
        self._clock_support(gpu)
        top = int(gpu.model.max_sm_clock_mhz or 1980)
        lo, hi = int(min_mhz), int(max_mhz)
        if not ph.IDLE_SM_CLOCK_MHZ <= lo <= hi <= top:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not self._node.power_admin:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        self.locked_clock_calls += 1
        with gpu.lock:
            gpu.locked_clocks_mhz = (lo, hi)
        self._keep_locks()

    def nvmlDeviceResetGpuLockedClocks(self, h: Any) -> None:
        gpu = self._gpu(h)
        self._clock_support(gpu)
        if not self._node.power_admin:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        self.locked_clock_calls += 1
        with gpu.lock:
            gpu.locked_clocks_mhz = None
        self._keep_locks()

    def _keep_locks(self) -> None:
        """The node's locks written for the processes after this one (a lock outlives its
        process: `gpufleet.devices.sim.locks`)."""
        if self._node.lock_file is None:
            return
        from gpufleet.devices.sim.locks import write_locks

        locks = {g.index: g.locked_clocks_mhz for g in self._node.gpus}
        write_locks(self._node.lock_file, {i: m for i, m in locks.items() if m is not None})
