"""Readiness checks against fixture trees: the healthy HGX H100 node passes every check, each
fault overlay turns exactly its own check, and this machine's real /proc and /sys give clear
findings without a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.devices.doctor import STATUSES, Check
from gpufleet.health.types import Severity
from gpufleet.readiness import (
    Expectations,
    FileRunner,
    Host,
    NvmlFacts,
    readiness_findings,
    readiness_test_result,
    run_readiness,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "readiness"
HEALTHY = FIXTURES / "hgx-h100"
GIB = 2**30
# NVML of the healthy node: H100 SXM5 80 GB reports 81559 MiB (85520809984 bytes) each
NVML = NvmlFacts(driver_version="550.54.15", gpu_count=8, gpu_memory_bytes=(85520809984,) * 8)
SITE = Expectations(cuda=("12.4",), ib_rate_gbps=400, link_layer="InfiniBand", mtu=4092)


def tree(tmp_path: Path, fault: str | None = None) -> Path:
    """A copy of the healthy tree with one fault overlay applied."""
    root = tmp_path / "node"
    shutil.copytree(HEALTHY, root, symlinks=True)
    if fault:
        overlay = FIXTURES / "faults" / fault
        assert overlay.is_dir(), fault
        for rel in (
            (overlay / ".remove").read_text().split() if (overlay / ".remove").exists() else []
        ):
            target = root / rel
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        for src in overlay.rglob("*"):
            if src.is_file() and src.name != ".remove":
                dst = root / src.relative_to(overlay)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
    return root


def checks(root: Path, nvml: NvmlFacts = NVML, expect: Expectations = SITE) -> dict[str, Check]:
    return {
        f"{c.phase}.{c.name}": c for c in run_readiness(Host(root, FileRunner(root)), nvml, expect)
    }


def test_healthy_hgx_h100_passes_every_phase(tmp_path: Path) -> None:
    got = checks(tree(tmp_path))
    assert {c.status for c in got.values()} == {"ok"}, {
        k: c.detail for k, c in got.items() if c.status != "ok"
    }
    phases = {c.phase for c in got.values()}
    assert phases == {"driver", "cuda", "containers", "gpudirect", "network", "host"}
    # one check per InfiniBand port of the tree: 8 ConnectX-7, one port each
    assert sum(k.startswith("network.port_mlx5_") for k in got) == 8
    assert "fabric completed on 8 GPU(s)" in got["driver.fabric_state"].detail
    assert (
        readiness_findings(
            tree(tmp_path / "again"), FileRunner(tmp_path / "again" / "node"), NVML, SITE
        )
        == []
    )


FAULTS = [
    # (overlay, check, status, words of the detail)
    ("module-mismatch", "driver.kernel_module", "fail", "550.90.07"),
    ("nouveau", "driver.nouveau", "fail", "nouveau"),
    ("no-persistenced", "driver.persistenced", "warn", "not running"),
    ("no-fabricmanager", "driver.fabricmanager", "fail", "cudaErrorSystemNotReady"),
    ("fabricmanager-version", "driver.fabricmanager", "fail", "550.54.14"),
    ("fabric-not-started", "driver.fabric_state", "fail", "GPU 1: not_started"),
    ("no-container-toolkit", "containers.container_toolkit", "warn", "not installed"),
    ("containerd-unconfigured", "containers.runtime_containerd", "fail", "no nvidia runtime"),
    ("no-peermem", "gpudirect.peermem", "warn", "nvidia_peermem"),
    ("acs-enabled", "gpudirect.acs", "fail", "0000:42:01.0"),
    ("acs-unreadable", "gpudirect.acs", "unknown", "could not read"),
    ("iommu-translated", "gpudirect.iommu", "warn", "4 groups"),
    ("ib-port-down", "network.port_mlx5_3/1", "fail", "state DOWN"),
    ("ib-rate-low", "network.port_mlx5_5/1", "fail", "rate 200 Gb/s, declared 400"),
    ("link-layer", "network.port_mlx5_1/1", "fail", "link layer Ethernet"),
    ("mtu", "network.port_mlx5_2/1", "fail", "MTU 2044, declared 4092"),
    ("cpu-governor", "host.cpu_governor", "warn", "powersave on 1 of 4"),
    ("numa-balancing", "host.numa_balancing", "warn", "numa_balancing=1"),
    ("low-memory", "host.memory_per_gpu", "warn", "0.4x"),
]


def test_every_fault_overlay_is_tested() -> None:
    on_disk = {p.name for p in (FIXTURES / "faults").iterdir()} - {"forward-compat"}
    assert on_disk == {f[0] for f in FAULTS}


@pytest.mark.parametrize(("fault", "name", "status", "words"), FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_turns_exactly_its_check(
    tmp_path: Path, fault: str, name: str, status: str, words: str
) -> None:
    got = checks(tree(tmp_path, fault))
    changed = {k: c.status for k, c in got.items() if c.status != "ok"}
    assert changed == {name: status}, {k: got[k].detail for k in changed}
    assert words in got[name].detail
    assert got[name].hint  # every problem says what to do
    findings = readiness_findings(
        tree(tmp_path / "f", fault), FileRunner(tmp_path / "f" / "node"), NVML, SITE
    )
    assert [f.code for f in findings] == [
        "READINESS_" + name.upper().replace(".", "_").replace("/", "_")
    ]
    assert findings[0].severity == Severity[status.upper()]
    assert findings[0].evidence["hint"] == got[name].hint


@pytest.mark.parametrize(
    ("cuda", "fault", "status", "words"),
    [
        ("12.4", None, "ok", ">= 550.54.14"),
        ("12.8", None, "warn", "minor version compatibility"),  # 550 < 570.26, >= 525.60.13
        ("13.0", None, "fail", "no forward compatibility package"),  # 13.x needs >= 580.65.06
        ("13.0", "forward-compat", "warn", "forward compatibility package"),
        ("12.7", None, "unknown", "not in the catalog"),  # there was no CUDA 12.7
    ],
)
def test_cuda_support_from_the_catalog_table(
    tmp_path: Path, cuda: str, fault: str | None, status: str, words: str
) -> None:
    got = checks(tree(tmp_path, fault), expect=Expectations(cuda=(cuda,)))
    cuda_checks = [c for c in got.values() if c.phase == "cuda"]
    assert [c.status for c in cuda_checks] == [status]
    assert words in cuda_checks[0].detail


def test_nvml_fabric_state_wins_over_nvidia_smi(tmp_path: Path) -> None:
    nvml = NvmlFacts(
        driver_version="550.54.15",
        gpu_count=8,
        gpu_memory_bytes=NVML.gpu_memory_bytes,
        fabric_states=("completed",) * 7 + ("in_progress",),
    )
    got = checks(tree(tmp_path), nvml=nvml)["driver.fabric_state"]
    assert (got.status, "GPU 7: in_progress" in got.detail) == ("warn", True)


def test_no_declarations_judge_nothing_declared(tmp_path: Path) -> None:
    """A 200 Gb/s port is fine when no rate is declared, and CUDA is skipped."""
    root = tree(tmp_path, "ib-rate-low")
    got = checks(root, expect=Expectations())
    assert got["network.port_mlx5_5/1"].status == "ok"
    assert got["cuda.cuda"].status == "skip"


def test_this_machine_gives_clear_findings_without_a_crash() -> None:
    """The real /proc and /sys of the test machine (no GPU here, usually): every check has a
    known status, a detail, and a hint when it is a problem; no exception escapes."""
    got = run_readiness(Host(), NvmlFacts(), Expectations(cuda=("12.4",), ib_rate_gbps=400))
    assert {c.phase for c in got} >= {"driver", "cuda", "host"}
    for c in got:
        assert c.status in STATUSES and c.detail, c
        if c.status in ("warn", "fail"):
            assert c.hint, c
    findings = readiness_findings()
    assert all(f.rule == "readiness" and f.component == "node" for f in findings)
    assert all(f.severity != Severity.OK for f in findings)


@pytest.mark.parametrize(
    ("fault", "status"), [(None, "pass"), ("no-peermem", "warn"), ("nouveau", "fail")]
)
def test_validate_level_one_result(tmp_path: Path, fault: str | None, status: str) -> None:
    root = tree(tmp_path, fault)
    result = readiness_test_result("n1", run_readiness(Host(root, FileRunner(root)), NVML, SITE))
    assert (result.test, result.node, result.status.value) == ("readiness", "n1", status)
    assert result.details["driver/kernel_module"]["status"] == "ok"
    if fault:
        assert "nouveau" in result.message or "nvidia_peermem" in result.message
