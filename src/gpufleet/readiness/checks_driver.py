"""Readiness phases "driver" and "cuda": kernel module and its version, nouveau, persistence
daemon, fabric manager and fabric state on NVSwitch systems, CUDA releases the driver runs."""

from __future__ import annotations

import re
from functools import partial

from gpufleet.catalog.cuda import driver_support, load_cuda_table
from gpufleet.devices.doctor import Check
from gpufleet.errors import ConfigError
from gpufleet.readiness.host import (
    Host,
    first_version,
    kernel_driver_version,
    loaded_modules,
)
from gpufleet.readiness.types import Expectations, NvmlFacts

NVIDIA_VENDOR = "0x10de"
# PCI class codes (PCI Code and ID Assignment Specification): 0x0680 "other bridge" is how the
# NVSwitches of an HGX baseboard enumerate; 0x0300 VGA and 0x0302 3D controller are GPUs.
NVSWITCH_CLASS = "0x0680"
GPU_CLASSES = ("0x0300", "0x0302")


def pci_devices(host: Host, vendor: str, classes: tuple[str, ...]) -> list[str]:
    """PCI addresses whose ``vendor`` and ``class`` files match (sysfs ABI,
    Documentation/ABI/testing/sysfs-bus-pci: /sys/bus/pci/devices/<addr>/{vendor,class})."""
    out = []
    for addr in host.listdir("/sys/bus/pci/devices"):
        v = (host.read(f"/sys/bus/pci/devices/{addr}/vendor") or "").strip().lower()
        c = (host.read(f"/sys/bus/pci/devices/{addr}/class") or "").strip().lower()
        if v == vendor and c.startswith(classes):
            out.append(addr)
    return out


def driver_version(host: Host, nvml: NvmlFacts) -> str | None:
    """NVML's driver version, else the loaded kernel module's."""
    return nvml.driver_version or kernel_driver_version(host)


def check_driver(host: Host, nvml: NvmlFacts, expect: Expectations) -> list[Check]:
    """Kernel module loaded and equal to NVML's version; nouveau absent; nvidia-persistenced;
    on NVSwitch systems nvidia-fabricmanager at the driver's version and the fabric completed."""
    make = partial(Check, phase="driver")
    out: list[Check] = []
    modules = loaded_modules(host)
    if modules is None:
        out.append(
            make(
                "kernel_module",
                "unknown",
                "cannot read /proc/modules nor /sys/module",
                "run on the host (not in a container without /proc and /sys)",
            )
        )
    elif "nvidia" not in modules:
        out.append(
            make(
                "kernel_module",
                "fail",
                "the nvidia kernel module is not loaded",
                "install the driver (open kernel modules on Hopper and later), `modprobe nvidia`;"
                " `dmesg | grep -i nvrm` says why it failed",
            )
        )
    else:
        kver = kernel_driver_version(host)
        if kver and nvml.driver_version and kver != nvml.driver_version:
            out.append(
                make(
                    "kernel_module",
                    "fail",
                    f"kernel module {kver} but NVML (user space) {nvml.driver_version}",
                    "the driver was upgraded without reloading the module: reboot the node",
                )
            )
        else:
            seen = f"nvidia {kver or '(version unreadable)'} loaded"
            if nvml.driver_version:
                seen += f", NVML {nvml.driver_version}"
            out.append(make("kernel_module", "ok", seen))
    if modules is not None:
        if "nouveau" in modules:
            out.append(
                make(
                    "nouveau",
                    "fail",
                    "the nouveau module is loaded (it claims the GPUs before nvidia can)",
                    "blacklist nouveau in /etc/modprobe.d (blacklist nouveau, options nouveau "
                    "modeset=0), rebuild the initramfs, reboot",
                )
            )
        else:
            out.append(make("nouveau", "ok", "nouveau not loaded"))
    if host.running("nvidia-persistenced"):
        out.append(make("persistenced", "ok", "nvidia-persistenced running"))
    else:
        out.append(
            make(
                "persistenced",
                "warn",
                "nvidia-persistenced is not running (every NVML client pays driver start-up)",
                "systemctl enable --now nvidia-persistenced",
            )
        )
    out.extend(_fabric(host, nvml, expect))
    return out


def _fabric(host: Host, nvml: NvmlFacts, expect: Expectations) -> list[Check]:
    make = partial(Check, phase="driver")
    switches = pci_devices(host, NVIDIA_VENDOR, (NVSWITCH_CLASS,))
    nvswitch = expect.nvswitch if expect.nvswitch is not None else bool(switches)
    if not nvswitch:
        return [
            make("fabricmanager", "skip", "no NVSwitch on this node: fabric manager not needed")
        ]
    out: list[Check] = []
    # the daemon is nv-fabricmanager, run by the nvidia-fabricmanager service (NVIDIA Fabric
    # Manager User Guide, docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/)
    if not host.running("nv-fabricmanager"):
        out.append(
            make(
                "fabricmanager",
                "fail",
                f"NVSwitch system ({len(switches) or 'declared'} switches) but nv-fabricmanager "
                "is not running: CUDA init fails with cudaErrorSystemNotReady",
                "install nvidia-fabricmanager of the driver's exact version, "
                "systemctl enable --now nvidia-fabricmanager",
            )
        )
    else:
        fm = first_version(
            host.run(["nv-fabricmanager", "--version"]) or host.run(["nv-fabricmanager", "-v"])
        )
        drv = driver_version(host, nvml)
        if fm and drv and fm != drv:
            out.append(
                make(
                    "fabricmanager",
                    "fail",
                    f"nv-fabricmanager {fm} but driver {drv} (it must match the driver exactly)",
                    "install the nvidia-fabricmanager package of the driver's version, restart it",
                )
            )
        elif fm is None or drv is None:
            out.append(
                make(
                    "fabricmanager",
                    "unknown",
                    "nv-fabricmanager running; its version or the driver's is unreadable",
                    "`nv-fabricmanager --version` should equal the driver version",
                )
            )
        else:
            out.append(make("fabricmanager", "ok", f"nv-fabricmanager {fm} running"))
    out.append(_fabric_state(host, nvml))
    return out


_FABRIC_STATE = re.compile(r"^\s*State\s*:\s*(.+?)\s*$")


def smi_fabric_states(text: str) -> list[str]:
    """The ``State`` of each GPU's ``Fabric`` section of ``nvidia-smi -q`` (R535+; "Completed",
    "In Progress", "Not Started", "N/A"), lower case with underscores."""
    states: list[str] = []
    in_fabric = False
    indent = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Fabric":
            in_fabric, indent = True, len(line) - len(line.lstrip())
            continue
        if in_fabric:
            if stripped and len(line) - len(line.lstrip()) <= indent:
                in_fabric = False
                continue
            m = _FABRIC_STATE.match(line)
            if m:
                states.append(m.group(1).lower().replace(" ", "_").replace("n/a", "not_supported"))
                in_fabric = False
    return states


def _fabric_state(host: Host, nvml: NvmlFacts) -> Check:
    make = partial(Check, phase="driver")
    states = list(nvml.fabric_states)
    where = "NVML"
    if not states:
        states = smi_fabric_states(host.run(["nvidia-smi", "-q"]) or "")
        where = "nvidia-smi -q"
    if not states:
        return make(
            "fabric_state",
            "unknown",
            "no fabric state (NVML nvmlDeviceGetGpuFabricInfo nor nvidia-smi -q Fabric)",
            "a driver of R535 or later reports it; check `nvidia-smi -q | grep -A3 Fabric`",
        )
    bad = {i: s for i, s in enumerate(states) if s != "completed"}
    if not bad:
        return make("fabric_state", "ok", f"fabric completed on {len(states)} GPU(s) ({where})")
    worst = "fail" if any(s != "in_progress" for s in bad.values()) else "warn"
    shown = ", ".join(f"GPU {i}: {s}" for i, s in sorted(bad.items()))
    return make(
        "fabric_state",
        worst,
        f"fabric not completed ({shown}; {where})",
        "in_progress: wait for the fabric manager; otherwise read /var/log/fabricmanager.log",
    )


def check_cuda(host: Host, nvml: NvmlFacts, expect: Expectations) -> list[Check]:
    """Each declared CUDA release runs on this driver: natively, through minor version
    compatibility (warn), or only with the forward compatibility package (fail without it)."""
    make = partial(Check, phase="cuda")
    if not expect.cuda:
        return [make("cuda", "skip", "no CUDA release declared (--cuda 12.4)")]
    drv = driver_version(host, nvml)
    table = load_cuda_table()
    out: list[Check] = []
    for want in expect.cuda:
        try:
            row = table.release(want)
        except ConfigError as exc:
            out.append(make(f"cuda_{want}", "unknown", exc.message, exc.hint))
            continue
        name = f"cuda_{row.cuda}"
        if drv is None:
            out.append(make(name, "unknown", "driver version unknown (no NVML, no module)"))
            continue
        support = driver_support(drv, row)
        if support == "native":
            out.append(make(name, "ok", f"driver {drv} >= {row.min_driver} for CUDA {row.cuda}"))
        elif support == "minor":
            out.append(
                make(
                    name,
                    "warn",
                    f"driver {drv} < {row.min_driver}: CUDA {row.cuda} runs through minor version "
                    f"compatibility (>= {row.minor_compat_driver}), without newer PTX JIT",
                    f"upgrade the driver to >= {row.min_driver} for full CUDA {row.cuda} support",
                )
            )
        else:
            compat = host.glob(f"/usr/local/cuda-{row.cuda}/compat/libcuda.so*")
            if compat:
                out.append(
                    make(
                        name,
                        "warn",
                        f"driver {drv} < {row.minor_compat_driver}: CUDA {row.cuda} runs only "
                        f"through the forward compatibility package (found {compat[0].name})",
                        f"jobs need LD_LIBRARY_PATH=/usr/local/cuda-{row.cuda}/compat "
                        "(data center GPUs only)",
                    )
                )
            else:
                out.append(
                    make(
                        name,
                        "fail",
                        f"driver {drv} cannot run CUDA {row.cuda} (needs >= {row.min_driver}) "
                        "and no forward compatibility package is installed",
                        f"upgrade the driver, or install cuda-compat-{row.cuda.replace('.', '-')}",
                    )
                )
    return out
