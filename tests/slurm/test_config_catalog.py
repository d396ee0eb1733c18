"""`gpufleet config slurm` fills CPU topology, RealMemory and gres.conf Cores= from the catalog
(known systems) or the inventory, and says in a comment what it leaves out.

Expected figures are worked out by hand from the sources the catalog cites:
- DGX H100/H200 (NVIDIA DGX H100/H200 User Guide): 2 sockets x 56 cores x 2 threads = 224 CPUs;
  2 TB (2,000,000,000,000 bytes) installed; GPUs 0-3 on socket 0, 4-7 on socket 1;
- gres.conf(5) Cores: logical core indexes, socket 0's cores first, so with 56 cores a socket
  socket 0 is cores 0-55 and socket 1 is 56-111.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from gpufleet.catalog.models import SystemModel
from gpufleet.cli.app import app
from gpufleet.errors import ConfigError
from gpufleet.schedulers.slurm import config_gen as cg
from gpufleet.schedulers.slurm.node_facts import gpu_cores, logical_cores, sysfs_address

# 2 TB installed, 95% of it, in MiB, rounded down: 1.9e12 / 1,048,576 = 1,811,981.2
DGX_REAL_MEMORY = 2_000_000_000_000 * 95 // 100 // 2**20
DGX_TOPO = "CPUs=224 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 ThreadsPerCore=2"


def _plan(
    key: str | None, gpus: int = 8, gpu_key: str = "h100-sxm", servers: int = 4
) -> dict[str, object]:
    server: dict[str, object] = {"gpus": gpus, "gpu_key": gpu_key, "generic": key is None}
    if key:
        server["key"] = key
    cand = {"candidate": "c", "servers": servers, "server": server, "fabric": {}}
    return {"chosen": "c", "candidates": [cand]}


def test_dgx_h100_plan_gets_topology_memory_and_socket_cores() -> None:
    assert DGX_REAL_MEMORY == 1_811_981
    cl = cg.from_plan(_plan("dgx-h100"))
    assert cg.node_lines(cl) == [
        f"NodeName=gpu[001-004] {DGX_TOPO} RealMemory={DGX_REAL_MEMORY} Gres=gpu:h100:8 "
        "State=UNKNOWN"
    ]
    gres = [ln for ln in cg.gres_conf(cl).splitlines() if ln.startswith("NodeName=")]
    assert gres == [
        "NodeName=gpu[001-004] Name=gpu Type=h100 Count=4 File=/dev/nvidia[0-3] Cores=0-55",
        "NodeName=gpu[001-004] Name=gpu Type=h100 Count=4 File=/dev/nvidia[4-7] Cores=56-111",
    ]
    conf = cg.slurm_conf(cl)
    assert "RealMemory is 95% of its installed memory" in conf
    assert "MemSpecLimit" in conf  # how to keep memory for the OS, as slurm.conf(5) says
    assert "unknown" not in conf


def test_system_without_affinity_or_memory_says_so() -> None:
    # DGX B200: topology known (2 x 56 x 2), GPU sockets not: no Cores=, a comment instead
    b200 = cg.from_plan(_plan("dgx-b200", gpu_key="b200", servers=1))
    assert cg.node_lines(b200)[0].startswith(f"NodeName=gpu001 {DGX_TOPO} RealMemory=")
    gres = cg.gres_conf(b200).splitlines()
    assert "# gpu001: GPU-to-CPU affinity unknown: Cores= left out" in gres[2]
    assert gres[3] == "NodeName=gpu001 Name=gpu Type=b200 Count=8 File=/dev/nvidia[0-7]"
    # GB200 tray: 2 Grace x 72 cores, 1 thread each = 144 CPUs; no memory figure in the catalog
    tray = cg.from_plan(_plan("dgx-gb200-tray", gpus=4, gpu_key="gb200", servers=2))
    line = cg.node_lines(tray)[0]
    assert "CPUs=144 Boards=1 SocketsPerBoard=2 CoresPerSocket=72 ThreadsPerCore=1" in line
    assert "RealMemory" not in line
    assert "# gpu[001-002]: RealMemory unknown" in cg.slurm_conf(tray)


def test_generic_server_leaves_the_figures_out_with_a_comment() -> None:
    cl = cg.from_plan(_plan(None))
    assert cg.node_lines(cl) == ["NodeName=gpu[001-004] Gres=gpu:h100:8 State=UNKNOWN"]
    assert "# gpu[001-004]: CPU topology and RealMemory unknown" in cg.slurm_conf(cl)


def test_catalog_rejects_gpu_sockets_that_do_not_fit() -> None:
    base = {"key": "x", "name": "X", "gpu": "h100-sxm", "gpus": 2, "max_power_kw": 1.0}
    base |= {"rack_units": 1, "compute_nics": 0, "compute_nic_gbps": 0, "source": "test"}
    with pytest.raises(ValidationError, match="lists 1 GPUs, not 2"):
        SystemModel(**base, cpu_sockets=2, gpu_sockets=(0,))
    with pytest.raises(ValidationError, match="each socket below it"):
        SystemModel(**base, cpu_sockets=1, gpu_sockets=(0, 1))


def _sysfs(root: Path) -> Path:
    """2 sockets x 2 cores x 2 threads, Linux numbering: cpu0-3 first threads (cpu0 socket 0
    core 0, cpu1 socket 0 core 1, cpu2 socket 1 core 0, cpu3 socket 1 core 1), cpu4-7 their
    siblings in the same order. Two GPUs, one near each socket."""
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-7\n")
    for c in range(8):
        topo = cpu / f"cpu{c}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{(c // 2) % 2}\n")
        (topo / "core_id").write_text(f"{c % 2}\n")
    for addr, near in (("0000:18:00.0", "0-1,4-5"), ("0000:9a:00.0", "2-3,6-7")):
        dev = root / "sys/bus/pci/devices" / addr
        dev.mkdir(parents=True)
        (dev / "local_cpulist").write_text(near + "\n")
    return root


def test_host_gpu_affinity_from_sysfs(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    # logical cores (socket, core): (0,0)=0, (0,1)=1, (1,0)=2, (1,1)=3
    assert logical_cores(root) == {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1, 6: 2, 7: 3}
    assert sysfs_address("00000000:9A:00.0") == "0000:9a:00.0"  # NVML's 8-digit domain
    assert gpu_cores(["00000000:18:00.0", "00000000:9A:00.0"], root) == [[0, 1], [2, 3]]
    assert gpu_cores(["00000000:18:00.0", "00000000:3b:00.0"], root) is None  # one unknown
    assert gpu_cores(["00000000:18:00.0"], tmp_path / "absent") is None


def test_inventory_cores_become_gres_cores_and_bad_ones_name_the_field() -> None:
    gpus = [{"model": "h100-sxm", "cores": [0, 1]}, {"model": "h100-sxm", "cores": [2, 3]}]
    cl = cg.from_inventory({"nodes": [{"name": "n1", "gpus": gpus}]})
    assert cg.gres_conf(cl).splitlines()[2:] == [
        "NodeName=n1 Name=gpu Type=h100 Count=1 File=/dev/nvidia0 Cores=0-1",
        "NodeName=n1 Name=gpu Type=h100 Count=1 File=/dev/nvidia1 Cores=2-3",
    ]
    bad = {"nodes": [{"name": "n1", "gpus": [{"model": "h100-sxm", "cores": ["x"]}]}]}
    with pytest.raises(ConfigError, match=r"inv.json: nodes\[0\]\.gpus\[0\]\.cores"):
        cg.from_inventory(bad, source="inv.json")


def test_cli_plan_of_dgx_h200_writes_topology_and_cores(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan("dgx-h200", gpu_key="h200-sxm", servers=2)))
    res = CliRunner().invoke(app, ["config", "slurm", "--plan", str(plan), "--json"])
    assert res.exit_code == 0, res.output
    files = json.loads(res.output)["files"]
    assert (
        f"NodeName=gpu[001-002] {DGX_TOPO} RealMemory={DGX_REAL_MEMORY} Gres=gpu:h200:8 "
        "State=UNKNOWN" in files["slurm.conf"].splitlines()
    )
    assert (
        "NodeName=gpu[001-002] Name=gpu Type=h200 Count=4 File=/dev/nvidia[4-7] Cores=56-111"
        in files["gres.conf"].splitlines()
    )
