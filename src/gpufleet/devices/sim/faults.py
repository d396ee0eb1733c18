"""Fault injection: what can go wrong with a simulated GPU, and when.

Each fault is deterministic: it starts at ``at_s`` seconds after the simulation started (or at
once), optionally ends after ``duration_s``, and its effects are fixed by its parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    """The faults the simulator can inject (DESIGN.md, "The simulator speaks NVML")."""

    XID = "xid"  # an XID event (params: xid)
    ECC_SBE = "ecc_sbe"  # single-bit ECC errors (params: count, or rate_per_min)
    ECC_DBE = "ecc_dbe"  # double-bit ECC errors (params: count); also XID 48
    ROW_REMAP_PENDING = "row_remap_pending"  # a row remap waits for a GPU reset
    ROW_REMAP_FAILURE = "row_remap_failure"  # remapping failed (no spare rows); XID 64
    RETIRED_PAGES = "retired_pages"  # retired pages (params: sbe, dbe)
    PCIE_DOWNGRADE = "pcie_downgrade"  # link trained below max (params: gen, width)
    PCIE_REPLAYS = "pcie_replays"  # replay counter climbs (params: rate_per_min)
    THERMAL_SLOWDOWN = "thermal_slowdown"  # HW thermal slowdown: hot, clocks cut
    HW_POWER_BRAKE = "hw_power_brake"  # HW power brake slowdown asserted
    SLOW_GPU = "slow_gpu"  # delivers a fraction of its peak (params: fraction)
    FALLEN_OFF_BUS = "fallen_off_bus"  # GPU_IS_LOST on every call; XID 79
    HUNG_CALL = "hung_call"  # NVML calls on this GPU block (params: seconds)
    MEMORY_ERRORS = "memory_errors"  # the memory test finds bad addresses (params: count)
    PERSISTENCE_OFF = "persistence_off"  # persistence mode disabled
    ECC_DISABLED = "ecc_disabled"  # ECC mode off
    SLOW_LINK = "slow_link"  # the node's network link runs at a fraction (params: fraction)
    # NVLink errors on one link (params: link, rate_per_min of CRC errors, recovery count, down,
    # fraction: the GPU's peer-to-peer bandwidth while the link replays/retrains)
    NVLINK_ERRORS = "nvlink_errors"
    # a simulated update that goes wrong on this node (issue 15; read by
    # `gpufleet.devices.sim.update`, the update command of simulated campaigns, not at run time):
    UPDATE_NO_RETURN = "update_no_return"  # the node never comes back (its agent hangs)
    UPDATE_OLD_VERSION = "update_old_version"  # the command exits 0, the versions stay old
    UPDATE_FAILS_VALIDATION = "update_fails_validation"  # new versions, a double-bit ECC error
    UPDATE_GPU_LOST = "update_gpu_lost"  # new versions, a GPU falls off the bus on reboot


@dataclass(frozen=True)
class Fault:
    """One injected fault on one GPU (``gpu=None``: every GPU of the node)."""

    kind: FaultKind
    node: str | None = None
    gpu: int | None = None
    at_s: float = 0.0
    duration_s: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def active(self, elapsed_s: float) -> bool:
        if elapsed_s < self.at_s:
            return False
        return self.duration_s is None or elapsed_s < self.at_s + self.duration_s

    def param(self, name: str, default: Any = None) -> Any:
        """The parameter as given, else the kind's visible default (`DEFAULTS`), else
        ``default``."""
        if name in self.params:
            return self.params[name]
        return default_params(self.kind, self.params).get(name, default)

    def effective_params(self) -> dict[str, Any]:
        """The parameters the simulator acts on: those given plus the kind's defaults."""
        return {**default_params(self.kind, self.params), **self.params}


@dataclass(frozen=True)
class Default:
    """Values a fault kind takes when none of ``keys`` is given (the keys are alternatives:
    ``ecc_sbe`` with a ``count`` gets no default rate)."""

    keys: frozenset[str]
    values: dict[str, Any]


def _d(values: dict[str, Any], *alternatives: str) -> Default:
    return Default(frozenset(values) | frozenset(alternatives), values)


# What each fault kind does when the fleet file names only its kind. Every default is large
# enough that `gpufleet health --sim` (a 3 s window) or `gpufleet validate --sim` at the
# level that can see it reports it (tests/test_fault_defaults.py checks every kind).
DEFAULTS: dict[FaultKind, tuple[Default, ...]] = {
    FaultKind.XID: (_d({"xid": 13}),),  # XID 13: graphics engine exception (NVIDIA XID list)
    # 120 corrected errors a minute: 7,200/h against the 10/h of the `sbe_rate` health rule
    # (gpufleet.health.rules_memory.SbeRateParams); 6 in the default 3 s health window
    FaultKind.ECC_SBE: (_d({"rate_per_min": 120.0}, "count"),),
    FaultKind.ECC_DBE: (_d({"count": 1}),),  # one uncorrectable error fails the GPU
    # 64 pages retired for double-bit errors: above the 63 of the `retired_pages` health rule
    # (issue 3), the end of a pre-Hopper GPU's retirement table
    FaultKind.RETIRED_PAGES: (_d({"sbe": 0, "dbe": 64}),),
    # 300 replays a minute: ~10x the Gen5 x16 threshold of the `pcie_replay_rate` health rule
    # (1.92 per lane per minute x 16 = 30.7/min, issue 3)
    FaultKind.PCIE_REPLAYS: (_d({"rate_per_min": 300.0}),),
    # pcie_downgrade with neither `gen` nor `width` halves the width (x16 -> x8; it depends on
    # the model, so `SimGpu.pcie_link` applies it): a narrow link counts idle or busy, while a
    # generation below max counts only on a busy GPU (an idle GPU trains its link down)
    FaultKind.SLOW_GPU: (_d({"fraction": 0.85}),),  # 15 % slow: a clear matmul straggler
    FaultKind.HUNG_CALL: (_d({"seconds": 30.0}),),  # 6x the 5 s NVML deadline
    FaultKind.MEMORY_ERRORS: (_d({"count": 3}),),
    FaultKind.SLOW_LINK: (_d({"fraction": 0.5}),),
    # 10 CRC errors a second on link 0, the GPU's peer-to-peer bandwidth at 60 % while it replays
    FaultKind.NVLINK_ERRORS: (
        _d({"link": 0}),
        _d({"rate_per_min": 600.0}),
        _d({"recovery": 0}),
        _d({"down": False}),
        _d({"fraction": 0.6}),
    ),
}


def default_params(kind: FaultKind, given: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults ``kind`` takes given the parameters ``given`` (none where all are given)."""
    out: dict[str, Any] = {}
    for d in DEFAULTS.get(kind, ()):
        if not d.keys & given.keys():
            out.update(d.values)
    return out


UPDATE_FAULTS = frozenset(
    {
        FaultKind.UPDATE_NO_RETURN,
        FaultKind.UPDATE_OLD_VERSION,
        FaultKind.UPDATE_FAILS_VALIDATION,
        FaultKind.UPDATE_GPU_LOST,
    }
)
