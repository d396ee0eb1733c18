"""The test registry and levels: what each level runs, ``--only`` and ``--skip``.

Levels follow DCGM's run levels (quick, medium, long): 1 software and health, 2 adds bandwidth,
memory and matmul tests, 3 adds the sustained stress, targeted power and collectives. With
several nodes (``--nodes``/``--slurm`` or a simulated fleet of more than one node) level 3 also
runs the collectives across nodes and the pairwise node-to-node test.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import UnknownNameError, UsageError


@dataclass(frozen=True)
class TestDef:
    """One registered test."""

    __test__ = False  # not a pytest test class

    name: str
    level: int
    scope: str  # "gpu", "node" or "fleet"
    description: str
    multi_node: bool = False


TESTS: dict[str, TestDef] = {}


def register_test(t: TestDef) -> TestDef:
    """Add a test to the one registry (names are unique)."""
    if t.name in TESTS:
        raise ValueError(f"test {t.name!r} registered twice")
    TESTS[t.name] = t
    return t


for _t in (
    TestDef("software", 1, "node", "NVML loads, driver/CUDA/VBIOS versions match, CUDA usable"),
    TestDef("persistence", 1, "gpu", "persistence mode on"),
    TestDef("ecc", 1, "gpu", "ECC enabled"),
    TestDef("row_remap", 1, "gpu", "no pending row remap, no remap failure"),
    TestDef("retired_pages", 1, "gpu", "retired pages below the RMA limit"),
    TestDef("pcie_link", 1, "gpu", "PCIe link at max generation and width"),
    TestDef("mig_mode", 1, "gpu", "MIG mode as expected"),
    TestDef("processes", 1, "gpu", "no stray processes on the GPU"),
    TestDef("health_rules", 1, "gpu", "the agent's health rules (gpufleet.health)"),
    TestDef("readiness", 1, "node", "day-one readiness of the host (gpufleet doctor's checks)"),
    TestDef("pcie_bandwidth", 2, "gpu", "pinned host-to-device and device-to-host bandwidth"),
    TestDef("hbm_bandwidth", 2, "gpu", "device memory copy bandwidth (read + write)"),
    TestDef("memory", 2, "gpu", "write and verify patterns over >= 90 % of free memory"),
    TestDef("matmul", 2, "gpu", "short matmuls per precision, checked against a reference"),
    TestDef("nvlink_p2p", 2, "node", "NVLink peer-to-peer copy bandwidth of every GPU pair"),
    TestDef("stress", 3, "gpu", "sustained stress with a power/temperature/clock trace"),
    TestDef("targeted_power", 3, "gpu", "reaches at least 0.95 x the power limit"),
    TestDef("collectives", 3, "node", "NCCL collectives over all GPUs of the node, 8 B..8 GiB"),
    TestDef("multinode_collectives", 3, "fleet", "collectives across nodes", multi_node=True),
    TestDef("pairwise", 3, "fleet", "node-to-node bandwidth of every pair", multi_node=True),
):
    register_test(_t)


def select_tests(
    level: int,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    multi_node: bool = False,
) -> list[str]:
    """Names of the tests to run, in registry order.

    ``only`` picks tests regardless of level (still in registry order); ``skip`` removes tests.
    Unknown names raise UnknownNameError with suggestions.
    """
    if level not in (1, 2, 3):
        raise UsageError(f"--level {level}: expected 1, 2 or 3")
    known = list(TESTS)
    for name in [*(only or []), *(skip or [])]:
        if name not in TESTS:
            raise UnknownNameError("test", name, known)
    if only:
        chosen = [n for n in known if n in set(only)]
    else:
        chosen = [
            n for n, t in TESTS.items() if t.level <= level and (multi_node or not t.multi_node)
        ]
    return [n for n in chosen if n not in set(skip or [])]


def split_names(values: list[str] | None) -> list[str]:
    """``--only a,b --only c`` -> ``[a, b, c]``."""
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out
