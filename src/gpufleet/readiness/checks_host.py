"""Readiness phases "network" and "host": every InfiniBand/RoCE port ACTIVE at the declared rate,
link layer and MTU; CPU frequency governor, automatic NUMA balancing, host memory per GPU."""

from __future__ import annotations

import re
from functools import partial

from gpufleet.devices.doctor import Check
from gpufleet.readiness.checks_driver import GPU_CLASSES, NVIDIA_VENDOR, pci_devices
from gpufleet.readiness.host import Host
from gpufleet.readiness.types import Expectations, NvmlFacts

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def port_rate_gbps(text: str | None) -> float | None:
    """``rate`` of a port: "400 Gb/sec (4X NDR)" (drivers/infiniband/core/sysfs.c, rate_show)."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def port_state(text: str | None) -> str | None:
    """``state`` of a port: "4: ACTIVE" -> "ACTIVE" (DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER;
    kernel Documentation/infiniband/sysfs.txt)."""
    if not text or not text.strip():
        return None
    return text.strip().split(":", 1)[-1].strip()


def _netdev_mtu(host: Host, dev: str) -> tuple[str, int] | None:
    # the port's network interface: /sys/class/infiniband/<dev>/device/net/<ifname>/mtu
    # (sysfs-class-net ABI: /sys/class/net/<iface>/mtu)
    for ifname in host.listdir(f"/sys/class/infiniband/{dev}/device/net"):
        text = host.read(f"/sys/class/infiniband/{dev}/device/net/{ifname}/mtu")
        if text and text.strip().isdigit():
            return ifname, int(text.strip())
    return None


def check_network(host: Host, expect: Expectations) -> list[Check]:
    """One check per port of /sys/class/infiniband: state ACTIVE; rate, link layer and MTU as
    declared (the rate is judged on ports of the declared link layer only, so that an Ethernet
    storage NIC is not held to the InfiniBand compute rate)."""
    make = partial(Check, phase="network")
    out: list[Check] = []
    for dev in host.listdir("/sys/class/infiniband"):
        for port in host.listdir(f"/sys/class/infiniband/{dev}/ports"):
            base = f"/sys/class/infiniband/{dev}/ports/{port}"
            name = f"port_{dev}/{port}"
            state = port_state(host.read(f"{base}/state"))
            rate = port_rate_gbps(host.read(f"{base}/rate"))
            layer = (host.read(f"{base}/link_layer") or "").strip() or None
            shown = f"{rate:g}" if rate is not None else "?"
            seen = f"{dev} port {port}: {state or '?'}, {shown} Gb/s, {layer or '?'}"
            problems: list[str] = []
            hints: list[str] = []
            if state is None:
                out.append(make(name, "unknown", f"{seen}; state unreadable"))
                continue
            if state != "ACTIVE":
                problems.append(f"state {state}")
                hints.append(
                    "DOWN: check the cable and the switch port; INIT: no subnet manager "
                    "has configured it (start opensm/UFM)"
                )
            if expect.link_layer and layer and layer.lower() != expect.link_layer.lower():
                problems.append(f"link layer {layer}, declared {expect.link_layer}")
                hints.append("set the port type with mlxconfig LINK_TYPE_P1 and reboot")
            judged = expect.link_layer is None or (layer or "").lower() == expect.link_layer.lower()
            rate_off = rate is None or rate != expect.ib_rate_gbps
            if expect.ib_rate_gbps and judged and state == "ACTIVE" and rate_off:
                problems.append(f"rate {shown} Gb/s, declared {expect.ib_rate_gbps:g}")
                hints.append("a lower rate: a cable, optic or switch port at the wrong speed")
            if expect.mtu and judged:
                mtu = _netdev_mtu(host, dev)
                if mtu is None:
                    problems.append("no network interface to read the MTU from")
                elif mtu[1] != expect.mtu:
                    problems.append(f"{mtu[0]} MTU {mtu[1]}, declared {expect.mtu}")
                    hints.append(f"ip link set {mtu[0]} mtu {expect.mtu} (and persist it)")
            if problems:
                out.append(make(name, "fail", f"{seen}: {'; '.join(problems)}", "; ".join(hints)))
            else:
                out.append(make(name, "ok", seen))
    if not out:
        if expect.ib_rate_gbps:
            return [
                make(
                    "ports",
                    "fail",
                    f"no InfiniBand/RoCE port, but {expect.ib_rate_gbps:g} Gb/s declared",
                    "load the NIC drivers (mlx5_ib) from DOCA/MLNX_OFED or the distribution",
                )
            ]
        return [make("ports", "skip", "no InfiniBand/RoCE port on this node")]
    return out


def meminfo_total_bytes(text: str | None) -> int | None:
    """``MemTotal:  2113412420 kB`` of /proc/meminfo (proc(5)); kB there means KiB."""
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def check_host(host: Host, nvml: NvmlFacts, expect: Expectations) -> list[Check]:
    """CPU governor "performance"; automatic NUMA balancing off; host memory per GPU."""
    make = partial(Check, phase="host")
    out: list[Check] = []
    # scaling_governor: Documentation/admin-guide/pm/cpufreq.rst ("Policy Interface in sysfs")
    govs = [
        (p.read_text(encoding="utf-8", errors="replace").strip())
        for p in host.glob("/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor")
    ]
    if not govs:
        out.append(make("cpu_governor", "skip", "no cpufreq: the firmware sets CPU frequency"))
    else:
        other = sorted({g for g in govs if g != "performance"})
        if other:
            out.append(
                make(
                    "cpu_governor",
                    "warn",
                    f"governor {', '.join(other)} on {sum(g != 'performance' for g in govs)} of "
                    f"{len(govs)} CPUs: host-side launch and data loading stall on clock ramps",
                    "cpupower frequency-set -g performance (persist it, or the BIOS profile)",
                )
            )
        else:
            out.append(make("cpu_governor", "ok", f"performance on {len(govs)} CPUs"))
    # numa_balancing: Documentation/admin-guide/sysctl/kernel.rst; 1 moves pages of pinned,
    # GPU-feeding processes between nodes behind their backs
    numa = (host.read("/proc/sys/kernel/numa_balancing") or "").strip()
    if not numa:
        out.append(make("numa_balancing", "skip", "kernel without automatic NUMA balancing"))
    elif numa == "0":
        out.append(make("numa_balancing", "ok", "automatic NUMA balancing off"))
    else:
        out.append(
            make(
                "numa_balancing",
                "warn",
                f"automatic NUMA balancing on (kernel.numa_balancing={numa})",
                "sysctl -w kernel.numa_balancing=0 and persist it in /etc/sysctl.d",
            )
        )
    out.append(_memory(host, nvml, expect))
    return out


def _memory(host: Host, nvml: NvmlFacts, expect: Expectations) -> Check:
    make = partial(Check, phase="host")
    total = meminfo_total_bytes(host.read("/proc/meminfo"))
    if total is None:
        return make("memory_per_gpu", "unknown", "cannot read MemTotal from /proc/meminfo")
    count = nvml.gpu_count or len(pci_devices(host, NVIDIA_VENDOR, GPU_CLASSES))
    if not count:
        return make("memory_per_gpu", "skip", f"{total / 2**30:.0f} GiB host memory, no GPU")
    per = total / count
    if not nvml.gpu_memory_bytes:
        return make(
            "memory_per_gpu", "ok", f"{per / 2**30:.0f} GiB host memory per GPU ({count} GPUs)"
        )
    gpu_total = sum(nvml.gpu_memory_bytes)
    ratio = total / gpu_total
    # NVIDIA-Certified Systems Configuration Guide (docs.nvidia.com/certification-programs/
    # nvidia-certified-configuration-guide/): system memory at least twice the GPU memory
    seen = (
        f"{total / 2**30:.0f} GiB host memory, {per / 2**30:.0f} GiB per GPU, "
        f"{ratio:.1f}x the {gpu_total / 2**30:.0f} GiB of GPU memory"
    )
    if ratio < expect.host_memory_ratio:
        return make(
            "memory_per_gpu",
            "warn",
            f"{seen} (< {expect.host_memory_ratio:g}x)",
            "pinned staging, checkpoints and data loaders need host memory: add DIMMs",
        )
    return make("memory_per_gpu", "ok", seen)
