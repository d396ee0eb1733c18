"""gpufleet: plan, validate and operate GPU fleets.

The Python API (docs/python-api.md) is what the CLI does, as calls::

    import gpufleet

    fleet = gpufleet.open_sim("1x8xh100")
    for row in gpufleet.sample(fleet):
        print(row.node, row.index, row.sample.power_w if row.sample else row.error)

Every name below is imported on first use, so ``import gpufleet`` loads no NVML, simulator,
numpy or HTTP library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # devices: open GPUs and read them
    "open_nvml": "gpufleet.facade",
    "open_sim": "gpufleet.facade",
    "sample": "gpufleet.facade",
    "GpuReading": "gpufleet.facade",
    "Fleet": "gpufleet.devices.discovery",
    "DeviceInfo": "gpufleet.devices.types",
    "Sample": "gpufleet.devices.types",
    # judge them
    "check_health": "gpufleet.facade",
    "HealthReport": "gpufleet.health.tracker",
    "run_validation": "gpufleet.facade",
    "ValidationReport": "gpufleet.validate.results",
    # plan
    "plan_cluster": "gpufleet.facade",
    "Plan": "gpufleet.plan.planner",
    "plan_mig": "gpufleet.facade",
    "MigPlan": "gpufleet.mig.planner",
    # talk to a controller
    "Client": "gpufleet.client",
    "ApiError": "gpufleet.client",
    "ControllerUnreachable": "gpufleet.client",
    "MalformedAnswer": "gpufleet.client",
    "Node": "gpufleet.client",
    "Finding": "gpufleet.client",
    "Job": "gpufleet.client",
    # errors
    "GpufleetError": "gpufleet.errors",
    "UsageError": "gpufleet.errors",
    "ConfigError": "gpufleet.errors",
    "NoDeviceError": "gpufleet.errors",
    "DeviceError": "gpufleet.errors",
    "GpuLostError": "gpufleet.errors",
}

__all__ = [
    "ApiError",
    "Client",
    "ConfigError",
    "ControllerUnreachable",
    "DeviceError",
    "DeviceInfo",
    "Finding",
    "Fleet",
    "GpuLostError",
    "GpuReading",
    "GpufleetError",
    "HealthReport",
    "Job",
    "MalformedAnswer",
    "MigPlan",
    "NoDeviceError",
    "Node",
    "Plan",
    "Sample",
    "UsageError",
    "ValidationReport",
    "__version__",
    "check_health",
    "open_nvml",
    "open_sim",
    "plan_cluster",
    "plan_mig",
    "run_validation",
    "sample",
]

if TYPE_CHECKING:
    from gpufleet.client import (
        ApiError,
        Client,
        ControllerUnreachable,
        Finding,
        Job,
        MalformedAnswer,
        Node,
    )
    from gpufleet.devices.discovery import Fleet
    from gpufleet.devices.types import DeviceInfo, Sample
    from gpufleet.errors import (
        ConfigError,
        DeviceError,
        GpufleetError,
        GpuLostError,
        NoDeviceError,
        UsageError,
    )
    from gpufleet.facade import (
        GpuReading,
        check_health,
        open_nvml,
        open_sim,
        plan_cluster,
        plan_mig,
        run_validation,
        sample,
    )
    from gpufleet.health.tracker import HealthReport
    from gpufleet.mig.planner import MigPlan
    from gpufleet.plan.planner import Plan
    from gpufleet.validate.results import ValidationReport


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpufleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
