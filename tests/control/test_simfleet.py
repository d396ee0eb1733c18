"""`gpufleet sim-fleet` against a real uvicorn server on loopback: the simulated nodes register
over HTTP, and an injected fault (XID 79 on one GPU) drains its node."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpufleet.cli.app import app
from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from tests.serving import serve_app

pytestmark = [pytest.mark.slow, pytest.mark.process]


@contextlib.contextmanager
def serving(svc: ControlService) -> Iterator[int]:
    """``svc`` started and served by uvicorn on a free loopback port (yielded)."""
    svc.start()
    try:
        with serve_app(create_app(svc)) as port:
            yield port
    finally:
        svc.stop()


def _sim_fleet(port: int, *args: str) -> Result:
    """``gpufleet sim-fleet ARGS`` against the server on ``port``, sampling every 0.25 s and
    pushing every 0.5 s, its summary as JSON; it must succeed."""
    r = CliRunner().invoke(
        app,
        [
            *("sim-fleet", "--controller", f"http://127.0.0.1:{port}", *args),
            *("--sample-interval", "0.25", "--push-interval", "0.5", "--json"),
        ],
    )
    assert r.exit_code == 0, r.output
    return r


def test_sim_fleet_with_an_admin_token_makes_one_node_bound_token_per_node(
    tmp_path: Path,
) -> None:
    """Job slots are taken only from node-bound agent tokens: given an admin token (from a
    file), sim-fleet makes one per node, its nodes join the scheduler, and the tokens are
    revoked when it stops."""
    svc = ControlService(ServiceConfig(data_dir=tmp_path / "d"), scheduler=EmbeddedBackend())
    admin = svc.store.tokens.create("admin")[0]
    token_file = tmp_path / "admin.token"
    token_file.write_text(admin + "\n", encoding="utf-8")
    with serving(svc) as port:
        _sim_fleet(
            port, "--token-file", str(token_file), "--nodes", "2", "--gpus-per-node", "2",
            "--duration", "3",
        )  # fmt: skip
        assert isinstance(svc.scheduler, EmbeddedBackend)
        assert sorted(svc.scheduler.store.nodes()) == ["sim-00", "sim-01"]
        made = [t for t in svc.store.tokens.list() if t.name.startswith("sim-fleet-")]
        assert sorted((t.node, t.role) for t in made) == [
            ("sim-00", "agent"),
            ("sim-01", "agent"),
        ]
        assert all(t.revoked_s is not None for t in made)


def test_sim_fleet_pushes_and_fault_drains(tmp_path: Path) -> None:
    # the breaker off: under load some nodes may still be validating when the GPU falls, and
    # the default breaker would then rightly refuse the drain (tested on its own elsewhere)
    # and liveness is not under test here: 12 agents and the controller share one process, and
    # under load a node's 0.5 s pushes once stalled past 3 x 0.5 s and it was declared lost
    # (lost detection has its own tests, with a manual clock and with real processes)
    config = ServiceConfig(
        data_dir=tmp_path / "d",
        max_pending=5000,
        policy=RemediationPolicy(max_out_fraction=1.0),
        lost_after_intervals=40,
    )
    svc = ControlService(config)
    token = svc.store.tokens.create("agent")[0]
    with serving(svc) as port:
        _pushes_and_drains(tmp_path, port, token, svc)


def _pushes_and_drains(tmp_path: Path, port: int, token: str, svc: ControlService) -> None:
    faults = tmp_path / "faults.yaml"
    faults.write_text("faults:\n  - {node: sim-02, gpu: 3, kind: fallen_off_bus, at_s: 1}\n")
    r = _sim_fleet(
        port, "--token", token, "--nodes", "12", "--gpus-per-node", "4", "--faults", str(faults),
        "--duration", "10",
    )  # fmt: skip
    out = json.loads(r.output[r.output.index("{") :])
    # 20 pushes per node in 10 s; 8 each is the share the 4 s run asked for (3 of 8), and
    # three runs at once on this 2-core machine got 219-228 of 240
    assert out["batches_acked"] >= 12 * 8 and out["errors"] == 0
    states = {n: c.state for n, c in svc.store.nodes.items()}
    assert len(states) == 12
    gpus = {n: sorted(c.gpus) for n, c in svc.store.nodes.items()}
    assert all(g == [0, 1, 2, 3] for n, g in gpus.items() if n != "sim-02"), gpus
    # sim-02's GPU 3 is in the inventory only if its identity was read before it fell off
    # at 1 s (a loaded machine starts the 12 simulated agents later than that)
    assert gpus["sim-02"][:3] == [0, 1, 2], gpus
    # out of service either way: drained from service by the agent's fail finding, or sent
    # to repair by its own level-1 validation when the GPU fell off before it entered service
    assert states["sim-02"] in ("draining", "repair"), states
    # the agent's health rules: the lost GPU (GPU_LOST) or its XID 79, whichever came first
    reason = svc.store.nodes["sim-02"].state_reason
    assert any(w in reason for w in ("GPU_LOST", "XID_79", "lost")), reason
    assert sum(1 for s in states.values() if s == "in_service") == 11
