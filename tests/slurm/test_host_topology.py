"""`gpufleet.devices.host`: CPU topology and memory from /proc and /sys fixture trees, and on this
machine compared with what slurmd itself finds (``slurmd -C``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.devices.host import HostTopology, parse_cpu_list, read_host

MEMINFO = "MemTotal:       2113871872 kB\nMemFree:        2000000000 kB\n"


def _tree(
    root: Path,
    places: dict[int, tuple[int, int]],
    online: str,
    *,
    sys: bool = True,
    meminfo: str | None = MEMINFO,
) -> Path:
    """A /proc + /sys tree: ``places`` maps CPU number -> (package id, core id)."""
    (root / "proc").mkdir(parents=True)
    blocks = [
        f"processor\t: {c}\nmodel name\t: Fixture CPU 9000\nphysical id\t: {p}\ncore id\t: {k}\n"
        for c, (p, k) in sorted(places.items())
    ]
    (root / "proc" / "cpuinfo").write_text("\n".join(blocks) + "\n")
    if meminfo is not None:
        (root / "proc" / "meminfo").write_text(meminfo)
    if sys:
        cpu = root / "sys" / "devices" / "system" / "cpu"
        cpu.mkdir(parents=True)
        (cpu / "online").write_text(online + "\n")
        for c, (p, k) in places.items():
            topo = cpu / f"cpu{c}" / "topology"
            topo.mkdir(parents=True)
            (topo / "physical_package_id").write_text(f"{p}\n")
            (topo / "core_id").write_text(f"{k}\n")
    return root


def _dual_socket_smt() -> dict[int, tuple[int, int]]:
    """2 sockets x 4 cores x 2 threads, numbered as Linux does on such hosts: CPUs 0-7 are
    the first thread of every core, 8-15 the second; core ids repeat per socket and skip."""
    core_ids = [0, 1, 4, 5]
    return {c: ((c % 8) // 4, core_ids[c % 4]) for c in range(16)}


def test_dual_socket_smt_host(tmp_path: Path) -> None:
    h = read_host(_tree(tmp_path, _dual_socket_smt(), "0-15"))
    assert h == HostTopology(
        cpus=16,
        boards=1,
        sockets_per_board=2,
        cores_per_socket=4,
        threads_per_core=2,
        memory_mb=2113871872 // 1024,  # 2064328 MiB
        cpu_model="Fixture CPU 9000",
    )
    assert h.complete


def test_cpuinfo_fallback_without_sys(tmp_path: Path) -> None:
    h = read_host(_tree(tmp_path, _dual_socket_smt(), "0-15", sys=False))
    assert (h.cpus, h.sockets_per_board, h.cores_per_socket, h.threads_per_core) == (16, 2, 4, 2)


def test_offline_cpu_leaves_an_inconsistent_figure_unknown(tmp_path: Path) -> None:
    # CPU 15 offline: 15 CPUs over 8 cores is no whole number of threads per core
    h = read_host(_tree(tmp_path, _dual_socket_smt(), "0-14"))
    assert h.cpus == 15 and h.threads_per_core is None and not h.complete


def test_unreadable_files_are_none_not_zero(tmp_path: Path) -> None:
    h = read_host(tmp_path)  # an empty root: nothing to read
    assert h == HostTopology()
    h = read_host(_tree(tmp_path / "r", {0: (0, 0)}, "0", meminfo="MemFree: 1 kB\n"))
    assert h.memory_mb is None and h.cpus == 1 and h.complete


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpu_list("0-x")


@pytest.mark.process
def test_this_machine_matches_slurmd() -> None:
    """This host's real /proc and /sys, read as slurmd reads them (``slurmd -C`` prints the
    NodeName line slurmd would register with)."""
    real = read_host()
    assert real.complete and real.memory_mb and real.memory_mb > 0
    slurmd = shutil.which("slurmd", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if slurmd is None:
        pytest.skip("slurmd is not installed (apt-get install slurmd)")
    text = subprocess.run(
        [slurmd, "-C"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    found = dict(re.findall(r"(\w+)=(\S+)", text.splitlines()[0]))
    assert int(found["CPUs"]) == real.cpus
    assert int(found["Boards"]) == real.boards
    assert int(found["SocketsPerBoard"]) == real.sockets_per_board
    assert int(found["CoresPerSocket"]) == real.cores_per_socket
    assert int(found["ThreadsPerCore"]) == real.threads_per_core
    assert int(found["RealMemory"]) == real.memory_mb
