"""Shared rig of the maintenance tests that need a controller: one on loopback
(`gpufleet.testing.testbed.Controller`) and nodes reporting their GPUs' inventory to it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.testbed import Controller


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[Controller]:
    """A started controller with its data in ``tmp_path/ctl``; stopped at the end."""
    controller = Controller(tmp_path / "ctl").start()
    try:
        yield controller
    finally:
        controller.stop()


def push_inventory(ctl: Controller, node: str, info: dict[str, Any]) -> str:
    """One telemetry batch from ``node``'s agent (with a token bound to it, returned): GPU 0,
    an h100-sxm, with the device info ``info``."""
    token = ctl.token("agent", node=node)
    body = {
        "schema_version": 1,
        "node": node,
        "agent_id": f"a-{node}",
        "seq": 1,
        "sent_at_s": time.time(),
        "devices": [{"index": 0, "uuid": f"GPU-{node}", "info": {"model": "h100-sxm", **info}}],
    }
    r = httpx.post(
        ctl.url + "/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    return token


def register(ctl: Controller, node: str, driver: str) -> None:
    """``node`` reported at ``driver`` and in service: its inventory, then the pass of its
    first validation (the agent's gate, played here)."""
    token = push_inventory(ctl, node, {"driver_version": driver})
    r = httpx.post(
        ctl.url + "/api/v1/validation-results",
        json={"node": node, "verdict": "pass"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code < 300, r.text
