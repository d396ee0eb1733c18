"""Node figures for the generated Slurm configuration that are not in a plan: a catalog system's
CPU topology, memory and GPU-to-socket affinity, and this host's GPU-to-core affinity.

Sources:
- slurm.conf(5) ``SocketsPerBoard``, ``CoresPerSocket``, ``ThreadsPerCore``, ``RealMemory``;
- gres.conf(5) ``Cores``: logical core indexes, "Core 0 will be the first core on the first
  socket, while core 1 will be the second core on the first socket" (lstopo's ``Core L#``);
- sysfs ABI (Documentation/ABI/testing/sysfs-bus-pci): ``/sys/bus/pci/devices/<addr>/
  local_cpulist``, the CPUs close to a device; Documentation/ABI/stable/
  sysfs-devices-system-cpu: ``cpuN/topology/physical_package_id`` and ``core_id``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpufleet.devices.host import parse_cpu_list
from gpufleet.schedulers.slurm.node_spec import CATALOG_MEMORY_FRACTION, NodeSpec


def catalog_node(system_key: object, gpus: int) -> NodeSpec:
    """A node's CPU topology, RealMemory and GPU-to-core affinity from the catalog system
    ``system_key`` (catalog/data/systems.yaml), each only where the catalog has it; a blank node
    for an unknown or generic system. RealMemory is :data:`CATALOG_MEMORY_FRACTION` of the
    installed memory, in MiB (config_gen's docstring says why)."""
    from gpufleet.catalog import load_catalog

    blank = NodeSpec(name="", gpus=())
    system = load_catalog().systems.get(system_key) if isinstance(system_key, str) else None
    if system is None:
        return blank
    memory = system.system_memory_bytes
    node = replace(
        blank,
        real_memory_mb=int(memory / 2**20 * CATALOG_MEMORY_FRACTION) if memory else None,
        figures_from="catalog" if memory else None,
    )
    sockets, cores = system.cpu_sockets, system.cpu_cores_per_socket
    threads = system.cpu_threads_per_core
    if not (sockets and cores and threads):
        return node
    node = replace(
        node,
        figures_from="catalog",
        cpus=sockets * cores * threads,
        boards=1,
        sockets_per_board=sockets,
        cores_per_socket=cores,
        threads_per_core=threads,
    )
    if system.gpu_sockets and len(system.gpu_sockets) == gpus:
        per_gpu = tuple(tuple(range(s * cores, (s + 1) * cores)) for s in system.gpu_sockets)
        node = replace(node, gpu_cores=per_gpu)
    return node


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def logical_cores(root: Path = Path("/")) -> dict[int, int] | None:
    """Online CPU id -> Slurm's logical core index (cores ordered by socket, then core id), or
    None when /sys cannot say."""
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    online = _read(cpu_dir / "online")
    try:
        cpus = parse_cpu_list(online) if online else []
    except ValueError:
        return None
    places: dict[int, tuple[int, int]] = {}
    for c in cpus:
        pkg = _read(cpu_dir / f"cpu{c}" / "topology" / "physical_package_id")
        core = _read(cpu_dir / f"cpu{c}" / "topology" / "core_id")
        if pkg is None or core is None or not pkg.isdigit() or not core.isdigit():
            return None
        places[c] = (int(pkg), int(core))
    if not places:
        return None
    index = {p: i for i, p in enumerate(sorted(set(places.values())))}
    return {c: index[p] for c, p in places.items()}


def sysfs_address(pci_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0`` (4-digit domain)."""
    domain, _, rest = pci_bus_id.strip().lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


def gpu_cores(pci_bus_ids: list[str | None], root: Path = Path("/")) -> list[list[int]] | None:
    """For each GPU (by PCI address), the logical core indexes of the CPUs close to it
    (``local_cpulist``); None unless every GPU's is readable."""
    cores = logical_cores(root)
    if cores is None or not pci_bus_ids:
        return None
    out: list[list[int]] = []
    for bus in pci_bus_ids:
        text = _read(
            root / "sys" / "bus" / "pci" / "devices" / sysfs_address(bus or "") / "local_cpulist"
        )
        if not bus or not text:
            return None
        try:
            near = parse_cpu_list(text)
        except ValueError:
            return None
        mine = sorted({cores[c] for c in near if c in cores})
        if not mine:
            return None
        out.append(mine)
    return out
