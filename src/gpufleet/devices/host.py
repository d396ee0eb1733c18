"""This host's CPU topology and memory, read from /proc and /sys (under an injectable root, so
tests read fixture trees), in the terms a Slurm ``NodeName`` line uses.

Sources:
- Linux ``Documentation/ABI/stable/sysfs-devices-system-cpu``: ``/sys/devices/system/cpu/online``
  (a CPU list such as ``0-63,128-191``), ``cpuN/topology/physical_package_id`` (the socket) and
  ``cpuN/topology/core_id`` (the core within the socket);
- proc(5): ``/proc/meminfo`` ``MemTotal`` in kB; ``/proc/cpuinfo`` ``physical id`` and
  ``core id`` (the fallback when /sys has no topology);
- slurm.conf(5) ``Boards``, ``SocketsPerBoard``, ``CoresPerSocket``, ``ThreadsPerCore``,
  ``RealMemory`` (MiB): slurmd compares them with what it finds and refuses a node whose
  configuration claims more. ``slurmd -C`` prints what slurmd finds; on a plain x86 host its
  ``RealMemory`` is ``MemTotal`` in MiB, rounded down, which is what :func:`read_host` reports
  (tests/slurm/test_host_topology.py compares the two on the machine running the tests).

A value that cannot be read is ``None``, never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostTopology:
    """CPUs, their arrangement, and memory of one host (``None``: could not be read)."""

    cpus: int | None = None  # online logical CPUs
    boards: int | None = None
    sockets_per_board: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    memory_mb: int | None = None  # MemTotal in MiB, rounded down (Slurm's RealMemory)
    cpu_model: str | None = None

    @property
    def complete(self) -> bool:
        """Every figure a Slurm node line needs is known and consistent."""
        parts = (self.boards, self.sockets_per_board, self.cores_per_socket, self.threads_per_core)
        if self.cpus is None or any(p is None for p in parts):
            return False
        product = 1
        for p in parts:
            product *= p or 0
        return product == self.cpus


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's CPU list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text.strip()!r}")
        out.extend(range(int(lo), int(hi if sep else lo) + 1))
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _memory_mb(root: Path) -> int | None:
    text = _read(root / "proc" / "meminfo")
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text or "", flags=re.MULTILINE)
    return int(m.group(1)) // 1024 if m else None


def _cpuinfo(root: Path) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one dict per processor block."""
    blocks: list[dict[str, str]] = []
    for block in (_read(root / "proc" / "cpuinfo") or "").split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" in fields:
            blocks.append(fields)
    return blocks


def _sys_places(root: Path) -> list[tuple[int, int]] | None:
    """(socket, core) of every online CPU from /sys, or None when /sys cannot say."""
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    online = _read(cpu_dir / "online")
    if online is None:
        return None
    try:
        cpus = parse_cpu_list(online)
    except ValueError:
        return None
    places = []
    for c in cpus:
        topo = cpu_dir / f"cpu{c}" / "topology"
        pkg, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if pkg is None or core is None:
            return None
        try:
            places.append((int(pkg), int(core)))
        except ValueError:
            return None
    return places or None


def _cpuinfo_places(blocks: list[dict[str, str]]) -> list[tuple[int, int]] | None:
    places = []
    for b in blocks:
        pkg, core = b.get("physical id"), b.get("core id")
        if pkg is None or core is None or not pkg.isdigit() or not core.isdigit():
            return None
        places.append((int(pkg), int(core)))
    return places or None


def read_host(root: Path = Path("/")) -> HostTopology:
    """This host's topology from ``root``/sys and ``root``/proc (``root`` is ``/`` on a real
    host, a fixture tree in tests). Sockets are the distinct package ids, cores the distinct
    (package, core) pairs; one board (Linux does not expose boards; slurmd counts one)."""
    blocks = _cpuinfo(root)
    model = next((b["model name"] for b in blocks if b.get("model name")), None)
    places = _sys_places(root) or _cpuinfo_places(blocks)
    memory = _memory_mb(root)
    if not places:
        return HostTopology(cpus=len(blocks) or None, memory_mb=memory, cpu_model=model)
    sockets = len({p for p, _ in places})
    cores = len(set(places))
    cpus = len(places)
    per_socket = cores // sockets if cores % sockets == 0 else None
    threads = cpus // cores if cpus % cores == 0 else None
    return HostTopology(
        cpus=cpus,
        boards=1,
        sockets_per_board=sockets,
        cores_per_socket=per_socket,
        threads_per_core=threads,
        memory_mb=memory,
        cpu_model=model,
    )
