"""GPM (profiling metrics) and MIG readings of `NvmlBackend`, as a mixin over its query helper.

dcgm-exporter's ``DCGM_FI_PROF_*`` set comes from NVML GPM on Hopper and newer: a metric is the
difference of two samples, so each reading keeps the previous sample per GPU (or MIG instance).
Source: NVML API Reference, "GPM Functions" (nvmlGpmSampleGet, nvmlGpmMetricsGet).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpufleet.devices.nvml.errors import mismatch_error
from gpufleet.errors import DeviceError

_ACTIVITY = ("prof_gr_engine_active", "prof_pipe_tensor_active", "prof_dram_active")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpmReadings:
    """``sample_gpm``, ``mig_instances`` and ``sample_mig`` for a backend that provides ``_lib``,
    ``call``, ``_dev`` and ``missing``."""

    _lib: Any
    _gpm_supported: dict[int, bool]
    _gpm_prev: dict[int, Any]

    def call(self, fn: str, *args: Any, gpu: int | None = None, variant: str | None = None) -> Any:
        raise NotImplementedError

    def _dev(self, fn: str, index: int, *args: Any, variant: str | None = None) -> Any:
        raise NotImplementedError

    def missing(self, symbol: str) -> bool:
        raise NotImplementedError

    def _metrics(self, prev: Any, sample: Any, ids: tuple[int, ...]) -> list[float | None] | None:
        """Each metric between two samples (None where NVML did not answer it); frees ``prev``."""
        lib = self._lib
        mg = lib.c_nvmlGpmMetricsGet_t()
        mg.version = lib.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = prev, sample
        for i, mid in enumerate(ids):
            mg.metrics[i].metricId = mid
        try:
            result = self.call("nvmlGpmMetricsGet", mg)
        finally:
            self._free_gpm(prev)
        if result is None:
            return None
        return [
            float(result.metrics[i].value)
            if result.metrics[i].nvmlReturn == lib.NVML_SUCCESS
            else None
            for i in range(len(ids))
        ]

    def sample_gpm(self, index: int) -> dict[str, float] | None:
        """dcgm-exporter's ``DCGM_FI_PROF_*`` set, as ratios 0..1 and PCIe bytes per second,
        averaged since the previous call; None where GPM is not supported and on the first call
        (a GPM metric needs two samples)."""
        lib = self._lib
        if self._gpm_supported.get(index) is False or self.missing("nvmlGpmSampleGet"):
            return None
        if index not in self._gpm_supported:
            support = self._dev("nvmlGpmQueryDeviceSupport", index)
            self._gpm_supported[index] = bool(support is not None and support.isSupportedDevice)
            if not self._gpm_supported[index]:
                return None
        sample = self.call("nvmlGpmSampleAlloc")
        if sample is None:
            self._gpm_supported[index] = False
            return None
        if self._dev("nvmlGpmSampleGet", index, sample) is None:
            self._free_gpm(sample)
            self._gpm_supported[index] = False
            return None
        prev = self._gpm_prev.get(index)
        self._gpm_prev[index] = sample
        if prev is None:
            return None
        ids = (
            lib.NVML_GPM_METRIC_GRAPHICS_UTIL,
            lib.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
            lib.NVML_GPM_METRIC_DRAM_BW_UTIL,
            lib.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
            lib.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        )
        values = self._metrics(prev, sample, ids)
        if values is None:
            return None
        out: dict[str, float] = {}
        for key, value in zip(_ACTIVITY, values[:3], strict=True):
            if value is not None:
                out[key] = value / 100.0
        for key, value in zip(
            ("prof_pcie_tx_bytes", "prof_pcie_rx_bytes"), values[3:], strict=True
        ):
            if value is not None:
                out[key] = value * 2**20
        return out or None

    def mig_instances(self, index: int) -> list[tuple[int, str, Any]]:
        """(GPU-instance id, profile name, MIG device handle) of each MIG instance; [] without MIG.

        The profile is the suffix of the MIG device's name ("NVIDIA H200 MIG 1g.18gb" -> 1g.18gb).
        """
        mode = self._dev("nvmlDeviceGetMigMode", index)
        if not mode or not mode[0]:
            return []
        count = self._dev("nvmlDeviceGetMaxMigDeviceCount", index) or 0
        out: list[tuple[int, str, Any]] = []
        for slot in range(int(count)):
            mh = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", index, slot)
            if mh is None:
                continue
            gi = self.call("nvmlDeviceGetGpuInstanceId", mh, gpu=index)
            name = _text(self.call("nvmlDeviceGetName", mh, gpu=index) or "")
            profile = name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else "unknown"
            if gi is not None:
                out.append((int(gi), profile, mh))
        return out

    def sample_mig(self, index: int) -> dict[int, tuple[str, dict[str, float]]]:
        """Per MIG instance: profile and its readings (memory used/free, and GPM activity
        ratios since the previous call through ``nvmlGpmMigSampleGet``)."""
        lib = self._lib
        ids = (
            lib.NVML_GPM_METRIC_GRAPHICS_UTIL,
            lib.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
            lib.NVML_GPM_METRIC_DRAM_BW_UTIL,
        )
        out: dict[int, tuple[str, dict[str, float]]] = {}
        for gi, profile, mh in self.mig_instances(index):
            values: dict[str, float] = {}
            mem = self.call("nvmlDeviceGetMemoryInfo", mh, gpu=index)
            if mem is not None:
                values["mem_used_bytes"] = float(mem.used)
                values["mem_free_bytes"] = float(mem.free)
            key = -(index * 1000 + gi)
            sample = self.call("nvmlGpmSampleAlloc")
            if sample is not None and self._dev("nvmlGpmMigSampleGet", index, gi, sample) is None:
                self._free_gpm(sample)
            elif sample is not None:
                prev = self._gpm_prev.get(key)
                self._gpm_prev[key] = sample
                got = None if prev is None else self._metrics(prev, sample, ids)
                for k, value in zip(_ACTIVITY, got or (), strict=False):
                    if value is not None:
                        values[k] = value / 100.0
            out[gi] = (profile, values)
        return out

    def _free_gpm(self, sample: Any) -> None:
        with contextlib.suppress(self._lib.NVMLError, mismatch_error(self._lib), DeviceError):
            self._lib.nvmlGpmSampleFree(sample)
