"""Shared helpers for the agent tests: simulated nodes and Debian binaries."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devices.sim import ManualClock, SimFleet, SimNode, parse_fleet_spec


def need_binary(name: str, package: str = "prometheus") -> str:
    """The binary's path; FAIL under CI when missing, skip (with the reason: the Debian
    ``package`` to install) elsewhere."""
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if path is None:
        msg = f"{name} not found (Debian package {package!r})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def sim_node(spec: str = "1x8xh100", clock: ManualClock | None = None) -> tuple[SimFleet, SimNode]:
    fleet = SimFleet(parse_fleet_spec(spec), clock=clock)
    return fleet, next(iter(fleet.nodes.values()))


def boot_node(tmp_path: Path, power_admin: bool = True) -> tuple[SimNode, Any]:
    """Node ``n0`` (2 H100, ``power_admin``: whether the agent may set power limits) booted from
    its fleet file in ``tmp_path``: the node and its backend. Booting again from the same file
    is a reboot: every GPU back at its default limit."""
    fleet = tmp_path / "fleet.yaml"
    doc = {"nodes": [{"name": "n0", "model": "h100-sxm", "gpus": 2, "power_admin": power_admin}]}
    fleet.write_text(json.dumps(doc), encoding="utf-8")
    node = SimFleet(parse_fleet_spec(str(fleet))).nodes["n0"]
    return node, node.backend()
