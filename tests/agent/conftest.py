"""Shared helpers for the agent tests: simulated nodes and Debian binaries."""

from __future__ import annotations

import os
import shutil

import pytest

from gpufleet.devices.sim import ManualClock, SimFleet, SimNode, parse_fleet_spec


def need_binary(name: str) -> str:
    """The binary's path; FAIL under CI when missing, skip (with the reason) elsewhere."""
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if path is None:
        msg = f"{name} not found (Debian package 'prometheus')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def sim_node(spec: str = "1x8xh100", clock: ManualClock | None = None) -> tuple[SimFleet, SimNode]:
    fleet = SimFleet(parse_fleet_spec(spec), clock=clock)
    return fleet, next(iter(fleet.nodes.values()))
