"""How serious each NVML error is, in one table (after Meta GCM's ``pynvml_errors``).

- ``ignore``: the GPU simply does not have the feature (NotSupported): the field becomes None.
- ``warn``: gpufleet cannot see something it should (NoPermission, FunctionNotFound on an
  older driver): recorded once, shown by ``gpufleet doctor``.
- ``critical``: the GPU is unusable until reset or reboot (GpuIsLost, ResetRequired,
  CorruptedInforom): the GPU is marked lost and health turns to fail.
Source of the codes: NVML API Reference, ``nvmlReturn_t`` (docs.nvidia.com/deploy/nvml-api/).
"""

from __future__ import annotations

from enum import StrEnum

import pynvml


class NvmlSeverity(StrEnum):
    IGNORE = "ignore"
    WARN = "warn"
    CRITICAL = "critical"
    ERROR = "error"


SEVERITY: dict[int, NvmlSeverity] = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: NvmlSeverity.IGNORE,
    pynvml.NVML_ERROR_NOT_FOUND: NvmlSeverity.IGNORE,
    pynvml.NVML_ERROR_NO_DATA: NvmlSeverity.IGNORE,
    pynvml.NVML_ERROR_NO_PERMISSION: NvmlSeverity.WARN,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: NvmlSeverity.WARN,
    pynvml.NVML_ERROR_DEPRECATED: NvmlSeverity.WARN,
    pynvml.NVML_ERROR_GPU_IS_LOST: NvmlSeverity.CRITICAL,
    pynvml.NVML_ERROR_RESET_REQUIRED: NvmlSeverity.CRITICAL,
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: NvmlSeverity.CRITICAL,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: NvmlSeverity.CRITICAL,
}


def severity_of(code: int) -> NvmlSeverity:
    """The severity of an NVML return code; anything not listed is a plain error."""
    return SEVERITY.get(code, NvmlSeverity.ERROR)


def error_name(code: int) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` style name of a return code."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name
    return f"NVML_ERROR_{code}"


class _NeverRaised(Exception):
    """Stands in for an exception class a library does not define."""


def mismatch_error(lib: object) -> type[Exception]:
    """pynvml's ``NVMLLibraryMismatchError``: raised (instead of ``NVMLError_FunctionNotFound``)
    by unversioned wrappers such as ``nvmlDeviceGetComputeRunningProcesses`` when the driver
    lacks the versioned symbol they call (``..._v3``). It is not an ``NVMLError`` subclass, so a
    caller catching ``NVMLError`` alone lets it escape."""
    cls = getattr(lib, "NVMLLibraryMismatchError", None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else _NeverRaised
