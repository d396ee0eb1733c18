"""`gpufleet doctor --sim` runs the readiness checks on a healthy simulated host, as `--root`
runs them on a captured tree: every phase appears, and the declarations are judged against it
(pass, warn or fail, with the usual exit codes).

Expected values, by hand:
- DGX H100 (catalog system for 8 H100 SXM; NVIDIA DGX H100/H200 User Guide): 8 single-port
  ConnectX-7 at 400 Gb/s for the compute fabric -> 8 InfiniBand ports at 400; 8 SXM GPUs on an
  NVSwitch baseboard -> nv-fabricmanager checked; 224 logical CPUs (2 x 56 x 2).
- CUDA 12.8 needs driver >= 570.26 natively; older R525+ drivers run it through minor version
  compatibility (CUDA Toolkit release notes, Table 3; CUDA Compatibility guide): a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.readiness import FileRunner, Host, NvmlFacts
from gpufleet.readiness.simhost import sim_host, write_tree

runner = CliRunner()
PHASES = {"driver", "cuda", "containers", "gpudirect", "network", "host"}


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["doctor", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['phase']}/{c['name']}": c for c in doc["readiness"]["checks"]}


def test_sim_dgx_h100_is_ready_in_every_phase() -> None:
    code, doc = doctor("--sim", "1x8xh100-sxm", "--cuda", "12.4", "--ib-rate", "400")
    assert code == 0, doc
    assert doc["readiness"]["node"] == "sim-00" and doc["readiness"]["status"] == "ok"
    checks = by_name(doc)
    assert {c["phase"] for c in checks.values()} == PHASES
    ports = [k for k in checks if k.startswith("network/port_")]
    assert len(ports) == 8 and all("400 Gb/s" in checks[k]["detail"] for k in ports)
    assert checks["driver/fabricmanager"]["status"] == "ok"
    assert checks["driver/fabric_state"]["detail"].startswith("fabric completed on 8 GPU(s)")
    assert checks["host/cpu_governor"]["detail"] == "performance on 224 CPUs"
    assert doc["nodes"][0]["node"] == "sim-00"  # the NVML part is still there


def test_declarations_are_judged_against_the_simulated_host(tmp_path: Path) -> None:
    # an 800 Gb/s fabric declared, 400 Gb/s ports: every port fails -> exit 2
    code, doc = doctor("--sim", "1x8xh100-sxm", "--ib-rate", "800")
    ports = [c for k, c in by_name(doc).items() if k.startswith("network/port_")]
    assert code == 2 and {c["status"] for c in ports} == {"fail"}
    assert "declared 800" in ports[0]["detail"]
    # a driver older than CUDA 12.8 wants: minor version compatibility, a warning -> exit 1
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: [{name: n, model: h100-sxm, gpus: 8, driver_version: 550.54.15}]\n")
    code, doc = doctor("--sim", str(fleet), "--cuda", "12.8")
    assert code == 1 and by_name(doc)["cuda/cuda_12.8"]["status"] == "warn"
    assert doc["readiness"]["node"] == "n"


def test_no_catalog_system_skips_what_it_cannot_know() -> None:
    # 4 H100 per node: no DGX of that shape, no NVSwitch baseboard, no NIC figures
    code, doc = doctor("--sim", "2x4xh100")
    checks = by_name(doc)
    assert code == 0, doc
    assert checks["driver/fabricmanager"]["status"] == "skip"
    assert checks["network/ports"]["status"] == "skip"
    assert doctor("--sim", "2x4xh100", "--no-readiness")[1]["readiness"]["checks"] == []


def test_tree_processes_use_the_kernels_15_character_names(tmp_path: Path) -> None:
    facts = NvmlFacts(driver_version="550.54.15", gpu_count=8, gpu_memory_bytes=(85520809984,) * 8)
    root = write_tree(sim_host("n", "h100-sxm", facts), tmp_path)
    # proc(5): comm is truncated to 15 characters, "nvidia-persistenced" -> "nvidia-persiste"
    comms = {p.read_text().strip() for p in root.glob("proc/*/comm")}
    assert "nvidia-persiste" in comms and "nv-fabricmanage" in comms
    host = Host(root, FileRunner(root))
    assert host.running("nvidia-persistenced") and host.running("nv-fabricmanager")
    assert host.read("/sys/module/nvidia/version") == "550.54.15\n"
