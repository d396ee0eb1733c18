"""A healthy host tree for a simulated node, so that `gpufleet doctor --sim` runs the readiness
checks the way `doctor --root` runs them on a captured tree.

The tree is what a correctly installed node of that kind would show (the layout of
:mod:`gpufleet.readiness.host`): the nvidia kernel module at the simulated driver's version,
nvidia-persistenced running, nv-fabricmanager at the same version with every GPU's fabric
completed on 8-GPU SXM boards (NVSwitch baseboards), ACTIVE InfiniBand ports at the catalog
system's compute NIC rate, the NVIDIA Container Toolkit with containerd's nvidia runtime, CPU
governor "performance", NUMA balancing off, IOMMU pass-through and the catalog system's
memory. Declarations (``--cuda``, ``--ib-rate``, ``--link-layer``, ``--mtu``) are then judged
against it as on a real host, so the verdicts pass, warn or fail. Figures the catalog does not
give (a system's memory, its CPUs, its NICs) are left out and their checks skip or fall back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.catalog import load_catalog
from gpufleet.catalog.models import SystemModel
from gpufleet.readiness.types import NvmlFacts

# InfiniBand data rate per lane (IBTA roadmap): HDR 50, NDR 100, XDR 200 Gb/s; ports are 4X
_IB_SPEED = {200: "HDR", 400: "NDR", 800: "XDR"}
_IPOIB_MTU = 4092  # IPoIB datagram-mode MTU on a 4096-byte IB MTU (RFC 4391: IB MTU - 4)


@dataclass(frozen=True)
class SimHost:
    """What a simulated node's tree is made from."""

    name: str
    gpu_model: str | None  # catalog key
    nvml: NvmlFacts
    system: SystemModel | None = None  # the catalog system of this GPU and count, if one

    @property
    def nvswitch(self) -> bool:
        """8 SXM GPUs sit on an NVSwitch baseboard (HGX 8-GPU); others do not."""
        gpu = load_catalog().gpus.get(self.gpu_model or "")
        return bool(gpu and gpu.form_factor == "sxm" and self.nvml.gpu_count == 8)


def sim_host(name: str, gpu_model: str | None, nvml: NvmlFacts) -> SimHost:
    """The simulated host of a node: its GPUs and the catalog system that matches them."""
    systems = load_catalog().systems_for(gpu_model) if gpu_model else []
    system = next((s for s in systems if s.gpus == nvml.gpu_count), None)
    return SimHost(name, gpu_model, nvml, system)


def _write(root: Path, absolute: str, text: str) -> None:
    path = root / absolute.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_tree(host: SimHost, root: Path) -> Path:
    """Write the healthy tree of ``host`` under ``root``; returns ``root``."""
    drv = host.nvml.driver_version
    nics = host.system.compute_nics if host.system else 0
    modules = ["nvidia_uvm", "nvidia_modeset", "nvidia"]
    if nics:
        modules = ["nvidia_peermem", *modules, "mlx5_ib", "ib_core", "mlx5_core"]
    # proc(5) /proc/modules: name size refcount users state address
    _write(
        root, "/proc/modules", "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in modules)
    )
    if drv:
        _write(root, "/sys/module/nvidia/version", f"{drv}\n")
        _write(
            root,
            "/proc/driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {drv}  Release Build  "
            "(gpufleet simulator)\n",
        )
    procs = ["systemd", "nvidia-persistenced", "containerd"]
    if host.nvswitch:
        procs.append("nv-fabricmanager")
        if drv:
            _write(
                root,
                "/.commands/nv-fabricmanager_--version",
                f"Fabric Manager version is : {drv}\n",
            )
        gpus = host.nvml.gpu_count or 0
        fabric = "".join(
            f"GPU 00000000:{i:02X}:00.0\n    Fabric\n        State                 : Completed\n"
            "        Status                : Success\n"
            for i in range(gpus)
        )
        _write(root, "/.commands/nvidia-smi_-q", fabric)
    for pid, comm in enumerate(procs, start=1):
        _write(root, f"/proc/{pid}/comm", f"{comm[:15]}\n")  # proc(5): comm is 15 chars
    _write(root, "/usr/bin/nvidia-ctk", "")
    _write(root, "/usr/bin/containerd", "")
    _write(root, "/.commands/nvidia-ctk_--version", "NVIDIA Container Toolkit CLI (simulated)\n")
    _write(
        root,
        "/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n',
    )
    gbps = host.system.compute_nic_gbps if host.system else 0
    for i in range(nics):
        port = f"/sys/class/infiniband/mlx5_{i}/ports/1"
        _write(root, f"{port}/state", "4: ACTIVE\n")
        _write(root, f"{port}/phys_state", "5: LinkUp\n")
        speed = f" {_IB_SPEED[gbps]}" if gbps in _IB_SPEED else ""
        _write(root, f"{port}/rate", f"{gbps} Gb/sec (4X{speed})\n")
        _write(root, f"{port}/link_layer", "InfiniBand\n")
        _write(root, f"/sys/class/infiniband/mlx5_{i}/device/net/ib{i}/mtu", f"{_IPOIB_MTU}\n")
    system = host.system
    if (
        system
        and system.cpu_sockets
        and system.cpu_cores_per_socket
        and system.cpu_threads_per_core
    ):
        cpus = system.cpu_sockets * system.cpu_cores_per_socket * system.cpu_threads_per_core
        for c in range(cpus):
            _write(
                root, f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor", "performance\n"
            )
    memory = system.system_memory_bytes if system else None
    if memory is None and host.nvml.gpu_memory_bytes:
        memory = 2 * sum(host.nvml.gpu_memory_bytes)  # the readiness minimum: twice GPU memory
    if memory:
        _write(root, "/proc/meminfo", f"MemTotal:       {memory // 1024} kB\n")
    _write(root, "/proc/sys/kernel/numa_balancing", "0\n")
    _write(root, "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro iommu=pt\n")
    return root
