"""Fault injection: what can go wrong with a simulated GPU, and when.

Each fault is deterministic: it starts at ``at_s`` seconds after the simulation started (or at
once), optionally ends after ``duration_s``, and its effects are fixed by its parameters.
"""

from __future__ import annotations

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

    def param(self, name: str, default: Any) -> Any:
        return self.params.get(name, default)


UPDATE_FAULTS = frozenset(
    {
        FaultKind.UPDATE_NO_RETURN,
        FaultKind.UPDATE_OLD_VERSION,
        FaultKind.UPDATE_FAILS_VALIDATION,
        FaultKind.UPDATE_GPU_LOST,
    }
)
