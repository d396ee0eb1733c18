"""A campaign on `gpufleet up` (a real process whose agents run inside it, over a simulated
fleet file): the update command is the simulator's update, which records the new driver in the
simulator's state directory (the fleet file is not written); each in-process agent closes NVML
for the update, reopens it once the result is reported, and pushes the new versions, so the
campaign completes (it used to stall in `verifying`). `up` itself keeps running: the command
gets no GPUFLEET_AGENT_PID to signal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.testbed import wait_for
from tests.integration.test_up_hung_nvml import _start_up

pytestmark = [pytest.mark.slow, pytest.mark.process]
OLD, NEW = "535.104.05", "550.90.07"
FLEET = f"""\
seed: 7
nodes:
  - {{name: u-00, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
  - {{name: u-01, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
"""


def test_campaign_on_up_completes_with_the_new_versions(tmp_path: Path) -> None:
    proc, url, token = _start_up(tmp_path, FLEET)
    fleet = tmp_path / "fleet.yaml"
    written = fleet.read_bytes()
    client = httpx.Client(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    try:
        names = {"u-00", "u-01"}

        def in_service() -> bool:
            nodes = client.get("/nodes").json()["nodes"]
            return {n["name"] for n in nodes if n["state"] == "in_service"} == names

        wait_for(in_service, 90, "both nodes in service")
        command = f"{sys.executable} -m gpufleet.devices.sim.update --fleet {fleet} --driver {NEW}"
        body = {
            "baseline": {"models": {"h100-sxm": {"driver": NEW}}},
            "batch": 1,
            "floor": 0.0,
            "update_command": command,
            "update_timeout_s": 60,
            "back_timeout_s": 60,
            "verify_timeout_s": 30,
            "validate_timeout_s": 90,
        }
        r = client.post("/maintenance/campaigns", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]

        def ended() -> dict[str, Any] | None:
            doc: dict[str, Any] = client.get(f"/maintenance/campaigns/{cid}").json()
            return doc if doc["state"] not in ("running", "paused") else None

        doc = wait_for(ended, 200, "campaign ended", step_s=0.5)
        assert doc["state"] == "done", doc
        assert {n["node"]: n["step"] for n in doc["nodes"]} == dict.fromkeys(names, "done")
        gpus = client.get("/gpus").json()
        assert {g["info"]["driver_version"] for g in gpus} == {NEW}
        # 550.x reports CUDA 12.4 (CUDA Toolkit Release Notes, Table 3: 12.4 GA >= 550.54.14)
        assert {g["info"]["cuda_driver_version"] for g in gpus} == {"12.4"}
        assert fleet.read_bytes() == written  # the user's fleet file is not written
        assert len(gpus) == 4
        assert proc.poll() is None, "gpufleet up ended during the campaign"
        # the chart's samples: one per step at least, never above the fleet's GPUs
        hist = doc["capacity"]["history"]
        assert len(hist) >= 7 and all(0 <= h["in_service_gpus"] <= 4 for h in hist)
        assert min(h["in_service_gpus"] for h in hist) == 2  # one node of two out at a time
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
