"""Readiness phases "containers" and "gpudirect": NVIDIA Container Toolkit and the engines'
runtime configuration; nvidia-peermem, PCIe ACS on GPU-NIC paths, IOMMU mode."""

from __future__ import annotations

import json
import os
import re
import tomllib
from functools import partial
from typing import Any

from gpufleet.devices.doctor import Check
from gpufleet.readiness.checks_driver import GPU_CLASSES, NVIDIA_VENDOR, pci_devices
from gpufleet.readiness.host import Host, loaded_modules
from gpufleet.readiness.types import Expectations


def check_containers(host: Host, expect: Expectations) -> list[Check]:
    """nvidia-ctk present; Docker's daemon.json and containerd's config.toml (or a drop-in under
    conf.d) name the nvidia runtime, or a CDI spec exists (NVIDIA Container Toolkit install
    guide, "Configuring containerd / Docker": `nvidia-ctk runtime configure --runtime=...`)."""
    make = partial(Check, phase="containers")
    if expect.containers is False:
        return [make("container_toolkit", "skip", "containers not used on this site")]
    engines = {
        e: host.exists(f"/etc/{e}") or host.which(binary) is not None
        for e, binary in (("docker", "dockerd"), ("containerd", "containerd"))
    }
    out: list[Check] = []
    ctk = host.which("nvidia-ctk") or (
        "nvidia-ctk" if host.run(["nvidia-ctk", "--version"]) else None
    )
    if ctk:
        # "NVIDIA Container Toolkit CLI version 1.14.6"
        found = re.search(r"version\s+v?(\d[\w.]*)", host.run(["nvidia-ctk", "--version"]) or "")
        version = f" {found.group(1)}" if found else ""
        out.append(make("container_toolkit", "ok", f"nvidia-ctk{version} at {ctk}"))
    elif expect.containers or any(engines.values()):
        out.append(
            make(
                "container_toolkit",
                "fail" if expect.containers else "warn",
                "NVIDIA Container Toolkit (nvidia-ctk) is not installed",
                "install nvidia-container-toolkit from NVIDIA's repository",
            )
        )
    else:
        out.append(make("container_toolkit", "skip", "no container engine installed"))
    cdi = [p for p in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml") if host.exists(p)]
    for engine, present in engines.items():
        if not present:
            continue
        configured = _docker_nvidia(host) if engine == "docker" else _containerd_nvidia(host)
        if configured:
            out.append(make(f"runtime_{engine}", "ok", f"{engine}: {configured}"))
        elif cdi:
            out.append(make(f"runtime_{engine}", "ok", f"{engine}: CDI spec {cdi[0]}"))
        else:
            out.append(
                make(
                    f"runtime_{engine}",
                    "fail",
                    f"{engine} is installed but has no nvidia runtime: containers see no GPU",
                    f"nvidia-ctk runtime configure --runtime={engine} && "
                    f"systemctl restart {engine}",
                )
            )
    return out


def _docker_nvidia(host: Host) -> str | None:
    # /etc/docker/daemon.json: {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    # (dockerd(8) "Daemon configuration file", runtimes)
    text = host.read("/etc/docker/daemon.json")
    try:
        doc = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    runtimes = doc.get("runtimes")
    if isinstance(runtimes, dict) and "nvidia" in runtimes:
        default = " (default)" if doc.get("default-runtime") == "nvidia" else ""
        return f"nvidia runtime in /etc/docker/daemon.json{default}"
    return None


def _containerd_nvidia(host: Host) -> str | None:
    # containerd config.toml: [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    # (v2 config) or [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia] (v3);
    # nvidia-ctk may write a drop-in under /etc/containerd/conf.d/ instead
    paths = ["/etc/containerd/config.toml"] + [
        f"/etc/containerd/conf.d/{n}" for n in host.listdir("/etc/containerd/conf.d")
    ]
    for path in paths:
        text = host.read(path)
        if not text:
            continue
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        if _has_nvidia_runtime(doc):
            return f"nvidia runtime in {path}"
    return None


def _has_nvidia_runtime(node: Any) -> bool:
    if isinstance(node, dict):
        runtimes = node.get("runtimes")
        if isinstance(runtimes, dict) and "nvidia" in runtimes:
            return True
        return any(_has_nvidia_runtime(v) for v in node.values())
    return False


def rdma_devices(host: Host) -> list[str]:
    """RDMA devices (InfiniBand and RoCE), from /sys/class/infiniband (kernel
    Documentation/infiniband/sysfs.txt)."""
    return host.listdir("/sys/class/infiniband")


def check_gpudirect(host: Host, expect: Expectations) -> list[Check]:
    """nvidia-peermem loaded where RDMA NICs are; ACS off on bridges between a GPU and a NIC
    under one PCIe switch; IOMMU off or in pass-through."""
    make = partial(Check, phase="gpudirect")
    nics = rdma_devices(host)
    if not nics:
        return [make("gpudirect", "skip", "no RDMA NIC on this node: GPUDirect RDMA not used")]
    out: list[Check] = []
    modules = loaded_modules(host)
    if modules is None:
        out.append(make("peermem", "unknown", "cannot read /proc/modules"))
    elif "nvidia_peermem" in modules:
        out.append(make("peermem", "ok", "nvidia_peermem loaded"))
    else:
        out.append(
            make(
                "peermem",
                "warn",
                f"{len(nics)} RDMA NIC(s) but nvidia_peermem is not loaded: GPUDirect RDMA needs "
                "it unless NCCL uses DMA-BUF",
                "modprobe nvidia-peermem (after the OFED/DOCA drivers) and list it in "
                "/etc/modules-load.d; DMA-BUF needs the open kernel modules and Linux >= 5.12",
            )
        )
    out.append(_acs(host, nics))
    out.append(_iommu(host))
    return out


def _pci_chain(host: Host, sysfs_path: str) -> list[str]:
    """The PCI addresses from the root port down to the device (the sysfs device path lists
    every bridge: /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...)."""
    real = os.path.realpath(host.path(sysfs_path))
    return [p for p in real.split(os.sep) if _BDF.fullmatch(p)]


_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def gpu_nic_bridges(host: Host, nics: list[str]) -> set[str]:
    """Bridges on the P2P path of every GPU and NIC that share a PCIe switch (their common
    ancestor below the root port, and the ports down to each of them)."""
    gpus = pci_devices(host, NVIDIA_VENDOR, GPU_CLASSES)
    gpu_chains = [_pci_chain(host, f"/sys/bus/pci/devices/{g}") for g in gpus]
    nic_chains = [_pci_chain(host, f"/sys/class/infiniband/{n}/device") for n in nics]
    bridges: set[str] = set()
    for g in gpu_chains:
        for n in nic_chains:
            common = 0
            while common < min(len(g), len(n)) - 1 and g[common] == n[common]:
                common += 1
            if common >= 2:  # a switch below the root port: P2P can stay in the switch
                bridges.update(g[common - 1 : -1])
                bridges.update(n[common - 1 : -1])
    return bridges


_ACS_ON = ("SrcValid+", "ReqRedir+", "CmpltRedir+")
DENIED = "<access denied>"


def acs_controls(lspci: str) -> dict[str, str]:
    """PCI address -> its ``ACSCtl:`` line from ``lspci -D -vvv`` (pciutils lspci(8); the
    Access Control Services capability prints ACSCap and ACSCtl as ``Flag+``/``Flag-``)."""
    out: dict[str, str] = {}
    current = None
    for line in lspci.splitlines():
        if line and not line[0].isspace():
            addr = line.split(" ", 1)[0].lower()
            current = addr if _BDF.fullmatch(addr) else f"0000:{addr}"
        elif current and line.strip().startswith("ACSCtl:"):
            out[current] = line.strip()[len("ACSCtl:") :].strip()
        elif current and line.strip() == "Capabilities: <access denied>":
            out[current] = DENIED  # lspci without root cannot read extended capabilities
    return out


def _acs(host: Host, nics: list[str]) -> Check:
    make = partial(Check, phase="gpudirect")
    bridges = gpu_nic_bridges(host, nics)
    if not bridges:
        return make("acs", "skip", "no GPU shares a PCIe switch with a NIC")
    text = host.run(["lspci", "-D", "-vvv"])
    if text is None:
        return make(
            "acs",
            "unknown",
            f"{len(bridges)} bridge(s) on GPU-NIC paths; lspci unavailable to read ACS",
            "install pciutils and run as root (ACS registers need root)",
        )
    controls = acs_controls(text)
    denied = sorted(b for b in bridges if controls.get(b) == DENIED)
    if denied:
        return make(
            "acs",
            "unknown",
            f"lspci could not read the capabilities of {len(denied)} bridge(s) on GPU-NIC paths",
            "run gpufleet doctor as root to read ACS",
        )
    on = sorted(b for b in bridges if any(f in controls.get(b, "") for f in _ACS_ON))
    if on:
        return make(
            "acs",
            "fail",
            f"ACS enabled on {len(on)} bridge(s) of GPU-NIC paths ({', '.join(on[:4])}): "
            "P2P is redirected through the root complex (NCCL hangs or runs slowly)",
            "disable ACS in the BIOS or with setpci at boot (NCCL Troubleshooting, "
            "PCI Access Control Services)",
        )
    return make("acs", "ok", f"ACS off on the {len(bridges)} bridge(s) of GPU-NIC paths")


def _iommu(host: Host) -> Check:
    make = partial(Check, phase="gpudirect")
    cmdline = (host.read("/proc/cmdline") or "").split()
    groups = host.listdir("/sys/kernel/iommu_groups")
    if "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline:
        return make("iommu", "ok", "IOMMU in pass-through (iommu=pt)")
    if any(a in cmdline for a in ("intel_iommu=off", "amd_iommu=off", "iommu=off")) or not groups:
        return make("iommu", "ok", "IOMMU off")
    return make(
        "iommu",
        "warn",
        f"IOMMU translating DMA ({len(groups)} groups, no iommu=pt): GPUDirect RDMA is slower "
        "or fails",
        "add iommu=pt to the kernel command line (NCCL Troubleshooting, IOMMU)",
    )
