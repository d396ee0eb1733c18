"""`gpufleet sim-fleet` against a real uvicorn server on loopback: the simulated nodes register
over HTTP, and an injected fault (XID 79 on one GPU) drains its node."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.api import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from tests.control.conftest import free_port, wait_for

pytestmark = pytest.mark.slow


def test_sim_fleet_pushes_and_fault_drains(tmp_path: Path) -> None:
    svc = ControlService(ServiceConfig(data_dir=tmp_path / "d", max_pending=5000))
    svc.start()
    token = svc.store.tokens.create("agent")[0]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(svc), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    assert wait_for(lambda: server.started, timeout=20)
    faults = tmp_path / "faults.yaml"
    faults.write_text("faults:\n  - {node: sim-02, gpu: 3, kind: fallen_off_bus, at_s: 1}\n")
    try:
        r = CliRunner().invoke(
            app,
            [
                "sim-fleet",
                "--controller",
                f"http://127.0.0.1:{port}",
                "--token",
                token,
                "--nodes",
                "12",
                "--gpus-per-node",
                "4",
                "--faults",
                str(faults),
                "--duration",
                "4",
                "--sample-interval",
                "0.25",
                "--push-interval",
                "0.5",
                "--json",
            ],
        )
        assert r.exit_code == 0, r.output
        out = json.loads(r.output[r.output.index("{") :])
        assert out["batches_acked"] >= 12 * 3 and out["errors"] == 0
        states = {n: c.state for n, c in svc.store.nodes.items()}
        assert len(states) == 12 and sum(len(c.gpus) for c in svc.store.nodes.values()) == 48
        assert states["sim-02"] == "draining", states
        # the agent's health rules: the lost GPU (GPU_LOST) or its XID 79, whichever came first
        reason = svc.store.nodes["sim-02"].state_reason
        assert "GPU_LOST" in reason or "XID_79" in reason, reason
        assert sum(1 for s in states.values() if s == "in_service") == 11
    finally:
        server.should_exit = True
        th.join(timeout=10)
        svc.stop()
