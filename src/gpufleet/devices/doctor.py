"""Checks that the device layer can work here, each problem with a hint how to fix it.

Checked: nvidia-ml-py importable; NVML loads; driver and NVML library versions match (a
mismatch after a driver upgrade without reboot is the classic "Failed to initialize NVML:
Driver/library version mismatch"); GPUs present; each GPU answers (not lost); persistence mode
on; ECC on; functions not found and permission problems met while reading.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.discovery import read_each
from gpufleet.errors import DeviceError, GpuLostError, NoDeviceError

STATUSES = ("ok", "warn", "fail", "unknown", "skip")
"""Check statuses: "unknown" when the check could not be made (a file unreadable, a tool absent),
"skip" when it does not apply here (no NVSwitch, no RDMA NIC); "skip" never changes a verdict."""


@dataclass(frozen=True)
class Check:
    """One doctor check: its status (`STATUSES`), what was seen, how to fix it, and its phase
    ("gpu" for the NVML checks; driver, cuda, containers, gpudirect, network, host for the
    readiness checks of `gpufleet.readiness`)."""

    name: str
    status: str
    detail: str
    hint: str | None = None
    phase: str = "gpu"


def overall_status(checks: list[Check]) -> str:
    """The verdict of several checks: fail > warn > unknown > ok (exit codes 2, 1, 3, 0)."""
    states = {c.status for c in checks}
    for word in ("fail", "warn", "unknown"):
        if word in states:
            return word
    return "ok"


@dataclass
class DoctorReport:
    """All checks of one node."""

    node: str
    checks: list[Check] = field(default_factory=list)

    @property
    def status(self) -> str:
        return overall_status(self.checks)


def versions_match(driver: str | None, nvml: str | None) -> bool | None:
    """NVML's version is ``<cuda major>.<driver version>`` (e.g. 13.580.159.04 for 580.159.04)."""
    if not driver or not nvml:
        return None
    return nvml.endswith(driver)


def check_backend(backend: GpuBackend) -> DoctorReport:
    """Run every check against one node's backend (real NVML or the simulator)."""
    report = DoctorReport(node=backend.node_name)
    add = report.checks.append
    try:
        count = backend.device_count()
    except NoDeviceError as exc:
        add(
            Check(
                "nvml",
                "fail",
                str(exc),
                "install the NVIDIA driver and check `lsmod | grep nvidia`",
            )
        )
        return report
    add(Check("nvml", "ok", "NVML initialised"))
    versions = backend.system_versions() if hasattr(backend, "system_versions") else {}
    driver, nvml = versions.get("driver_version"), versions.get("nvml_version")
    match = versions_match(driver, nvml)
    if match is False:
        add(
            Check(
                "driver_library_match",
                "fail",
                f"driver {driver} but NVML library {nvml}",
                "the driver was upgraded without unloading the old kernel module: reboot the node",
            )
        )
    elif match:
        add(
            Check(
                "driver_library_match",
                "ok",
                f"driver {driver}, NVML {nvml}, CUDA {versions.get('cuda_driver_version')}",
            )
        )
    if count == 0:
        add(
            Check(
                "gpus",
                "fail",
                "NVML reports 0 GPUs",
                "check `nvidia-smi -L` and `dmesg | grep -i nvrm`",
            )
        )
        return report
    add(Check("gpus", "ok", f"{count} GPU(s)"))
    infos = read_each(backend, "device_info", range(count))
    readings = read_each(backend, "sample", [i for i, v in infos.items() if _is_info(v)])
    for i in range(count):
        try:
            info = _raise_or(infos[i])
        except GpuLostError as exc:
            add(
                Check(
                    f"gpu{i}",
                    "fail",
                    str(exc),
                    "XID 79 territory: reboot; if it recurs, drain and inspect",
                )
            )
            continue
        except DeviceError as exc:
            add(Check(f"gpu{i}", "fail", str(exc)))
            continue
        # one reading, so that calls only sampling makes (and their fallbacks) show up
        if isinstance(readings.get(i), DeviceError):
            add(Check(f"gpu{i}.sample", "fail", str(readings[i])))
        if info.model is None:
            add(
                Check(
                    f"gpu{i}.model",
                    "warn",
                    f"{info.name} is not in the gpufleet catalog",
                    "thresholds fall back to generic values",
                )
            )
        if info.persistence_mode is False:
            add(
                Check(
                    f"gpu{i}.persistence",
                    "warn",
                    "persistence mode is off (every NVML client pays driver start-up, seconds)",
                    "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)",
                )
            )
        if info.ecc_current is False:
            add(
                Check(
                    f"gpu{i}.ecc",
                    "warn",
                    "ECC is disabled",
                    "nvidia-smi -i N -e 1, then reset the GPU or reboot",
                )
            )
        if (
            info.ecc_pending is not None
            and info.ecc_current is not None
            and info.ecc_pending != info.ecc_current
        ):
            add(
                Check(
                    f"gpu{i}.ecc_pending",
                    "warn",
                    "an ECC mode change is pending",
                    "reset the GPU or reboot to apply it",
                )
            )
    bad = [c for c in report.checks if c.name.startswith("gpu") and "." in c.name]
    if not bad and all(not c.name.startswith("gpu") or c.status == "ok" for c in report.checks):
        add(Check("gpu_config", "ok", "persistence mode and ECC on every GPU"))
    for problem in backend.problems():
        hint = (
            "upgrade the NVIDIA driver"
            if "not found" in problem
            else "run as root or adjust /dev/nvidia* permissions"
        )
        add(Check("nvml_call", "warn", problem, hint))
    return report


def _is_info(value: object) -> bool:
    return not isinstance(value, BaseException)


def _raise_or(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


def check_environment(simulated: bool = False) -> list[Check]:
    """Checks that need no GPU: the Python binding and (on real hardware) nvidia-smi."""
    checks: list[Check] = []
    try:
        import pynvml

        version = getattr(pynvml, "__version__", None) or "installed"
        checks.append(Check("nvidia-ml-py", "ok", f"nvidia-ml-py {version}"))
    except ImportError:
        checks.append(
            Check("nvidia-ml-py", "fail", "nvidia-ml-py is missing", "pip install nvidia-ml-py")
        )
    if simulated:
        return checks
    smi = shutil.which("nvidia-smi")
    checks.append(
        Check(
            "nvidia-smi",
            "ok" if smi else "warn",
            smi or "nvidia-smi not on PATH",
            None if smi else "comes with the NVIDIA driver",
        )
    )
    return checks
