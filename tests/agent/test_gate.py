"""The gate into service (issue 14 items 9 and 5): a real agent against a real controller with
the controller's default policy (``require_validation``). The agent runs validation level 1
by itself when its node waits in ``validating`` and posts the result; a failing level 1 keeps
the node out (repair, with the failing check as the reason) until it is repaired and passes;
a GPU whose NVML calls hang becomes a fail finding that drains the node."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.devices.sim import Fault, FaultKind, SimFleet, parse_fleet_spec
from gpufleet.testing.testbed import Controller, free_port, wait_for
from tests.integration.processes import start, stop


def _node(ctl: Controller, name: str) -> dict[str, Any]:
    r = ctl.call("GET", f"/api/v1/nodes/{name}")
    if r.status_code != 200:
        return {}
    doc: dict[str, Any] = r.json()
    return doc


def _states(ctl: Controller, name: str) -> list[str]:
    """The states the node went through after registering, oldest first."""
    r = ctl.call("GET", f"/api/v1/nodes/{name}/transitions")
    assert r.status_code == 200, r.text
    return [t["to_state"] for t in sorted(r.json(), key=lambda t: t["id"])][1:]


@pytest.mark.process
def test_failing_level_1_keeps_the_node_out_until_repaired_and_passing(tmp_path: Path) -> None:
    ctl = Controller(tmp_path / "data", scheduler="none").start()
    stop_ev = threading.Event()
    thread: threading.Thread | None = None
    try:
        assert ctl.service is not None and ctl.service.store.policy.require_validation
        fleet = SimFleet(parse_fleet_spec("1x4xh200"))
        fault = Fault(FaultKind.ECC_DISABLED, node="sim-00", gpu=3)
        fleet.inject(fault)
        cfg = AgentConfig(
            fast_interval_s=0.2,
            push_interval_s=0.3,
            controller=ctl.url,
            token=ctl.token("agent", node="sim-00"),
            state_dir=tmp_path / "agent",
        )
        agent = Agent(fleet.node("sim-00").backend(), cfg)
        thread = threading.Thread(target=agent.run, args=(stop_ev,), daemon=True)
        thread.start()

        def out() -> dict[str, Any] | None:
            n = _node(ctl, "sim-00").get("node") or {}
            return n if n.get("state") == "repair" else None

        node = wait_for(out, 20, "sim-00 sent to repair by its failing level 1")
        reason = node["state_reason"]
        assert reason.startswith("validation result: fail (level 1 by the agent: ecc GPU 3")
        time.sleep(1.5)  # five more pushes: a node in repair stays out
        assert (_node(ctl, "sim-00").get("node") or {}).get("state") == "repair"
        assert agent.gate is not None and agent.gate.runs == 1

        # repaired: the operator asks for validation, the agent runs it again and it passes
        fleet.node("sim-00").gpus[3].faults.remove(fault)
        r = ctl.call("POST", "/api/v1/nodes/sim-00/actions/validate", json={"reason": "ECC on"})
        assert r.status_code == 200, r.text

        def back() -> dict[str, Any] | None:
            n = _node(ctl, "sim-00").get("node") or {}
            return n if n.get("state") == "in_service" else None

        node = wait_for(back, 20, "sim-00 back in service after a passing level 1")
        assert node["state_reason"].startswith("validation result: pass (level 1 by the agent")
        assert agent.gate.runs == 2
        assert _states(ctl, "sim-00") == [
            "validating",
            "repair",
            "validating",
            "in_service",
        ]
    finally:
        stop_ev.set()
        if thread is not None:
            thread.join(timeout=10)
        ctl.stop()


HUNG = """\
seed: 3
nodes:
  - {name: gate, model: h100-sxm, gpus: 8, count: 1}
faults:
  - {node: gate, gpu: 7, kind: hung_call, at_s: 6, seconds: 3600}
"""


@pytest.mark.process
def test_a_hung_gpu_is_a_fail_finding_that_drains_its_node(tmp_path: Path) -> None:
    """A real `gpufleet agent` process on a simulated node whose GPU 7 stops answering NVML
    six seconds in: before that the node validates itself into service; then the agent
    reports GPU_NVML_TIMEOUT ("GPU 7 did not answer NVML within 5 s") and the controller
    drains the node like any failed GPU."""
    ctl = Controller(tmp_path / "data", scheduler="none").start()
    proc = None
    try:
        spec = tmp_path / "fleet.yaml"
        spec.write_text(HUNG)
        token_file = tmp_path / "agent.token"
        token_file.write_text(ctl.token("agent", node="gate") + "\n")
        token_file.chmod(0o600)
        args = ["agent", "--sim", str(spec), "--controller", ctl.url]
        args += ["--token-file", str(token_file), "--state-dir", str(tmp_path / "state")]
        args += ["--fast-interval", "0.2", "--push-interval", "0.3", "--json"]
        args += ["--listen", f"127.0.0.1:{free_port()}"]
        proc, started = start(args, tmp_path)
        assert started["node"] == "gate"

        def in_service() -> bool:
            return (_node(ctl, "gate").get("node") or {}).get("state") == "in_service"

        wait_for(in_service, 6, "gate in service (validated by its agent) before the hang")

        def drained() -> dict[str, Any] | None:
            doc = _node(ctl, "gate")
            n = doc.get("node") or {}
            return doc if n.get("state") in ("draining", "drained") else None

        # hang at 6 s, NVML deadline 5 s, then one push; the reason below names the deadline
        doc = wait_for(drained, 30, "gate drained for its hung GPU")
        reason = doc["node"]["state_reason"]
        assert reason == "finding GPU_NVML_TIMEOUT: GPU 7 did not answer NVML within 5 s"
        found = [f for f in doc["findings"] if f["code"] == "GPU_NVML_TIMEOUT"]
        assert len(found) == 1 and found[0]["severity"] == 2 and found[0]["gpu_index"] == 7
        assert _states(ctl, "gate")[:2] == ["validating", "in_service"]
    finally:
        err = stop(proc) if proc is not None else ""
        ctl.stop()
    assert "Traceback" not in err, err[-3000:]


FAULTY = """\
seed: 5
nodes:
  - {name: val, model: h100-sxm, gpus: 4, count: 1}
faults:
  - {node: val, gpu: 2, kind: ecc_disabled}
"""


@pytest.mark.process
def test_gpufleet_validate_posts_any_level_to_the_controller(tmp_path: Path) -> None:
    """`gpufleet validate --controller URL --token-file F` posts each node's verdict: a level-1
    fail sends a validating node to repair naming the check, a later level-2 pass (no fault)
    puts it in service."""
    import json
    import subprocess

    from tests.integration.processes import GPUFLEET, env_for

    ctl = Controller(tmp_path / "data", scheduler="none").start()
    try:
        agent_auth = {"Authorization": f"Bearer {ctl.token('agent', node='val')}"}
        body = {
            "schema_version": 1,
            "node": "val",
            "agent_id": "agent-val",
            "seq": 1,
            "sent_at_s": time.time(),
            "heartbeat_interval_s": 60.0,
            "health": 0,
            "samples": [],
            "findings": [],
        }
        r = httpx.post(f"{ctl.url}/api/v1/ingest", json=body, headers=agent_auth, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["validate_since_s"] is not None  # the Ack asks the agent to validate
        assert (_node(ctl, "val").get("node") or {}).get("state") == "validating"
        token_file = tmp_path / "op.token"
        token_file.write_text(ctl.token("operator") + "\n")
        token_file.chmod(0o600)

        def validate(spec: str, level: int) -> tuple[int, dict[str, Any]]:
            path = tmp_path / f"fleet-{level}.yaml"
            path.write_text(spec)
            args = ["validate", "--sim", str(path), "--level", str(level), "--json"]
            args += ["--controller", ctl.url, "--token-file", str(token_file)]
            out = subprocess.run(
                [*GPUFLEET, *args],
                capture_output=True,
                text=True,
                env=env_for(tmp_path),
                timeout=120,
            )
            assert "Traceback" not in out.stderr, out.stderr
            return out.returncode, json.loads(out.stdout)

        rc, doc = validate(FAULTY, 1)
        assert rc == 2
        assert doc["posted"][0]["node"] == "val" and doc["posted"][0]["verdict"] == "fail"
        node = _node(ctl, "val")["node"]
        assert node["state"] == "repair"
        assert node["state_reason"].startswith("validation result: fail (level 1: ecc GPU 2")
        rc, doc = validate(FAULTY.split("faults:")[0], 2)
        assert rc in (0, 1), doc["posted"]
        assert (_node(ctl, "val").get("node") or {}).get("state") == "in_service"
        assert _states(ctl, "val") == ["validating", "repair", "validating", "in_service"]
    finally:
        ctl.stop()


def test_level_1_leaves_the_samplers_events_and_library_alone() -> None:
    """The agent's level 1 reads the backend its sampler uses: it must not take the node's
    events (an XID would never reach the health rules) nor shut NVML down, and it judges the
    health rules from the agent's own verdict."""
    from gpufleet.agent.gate import run_level1
    from gpufleet.devices.sim import ManualClock
    from gpufleet.health.types import Severity

    clock = ManualClock(1000.0)
    fleet = SimFleet(parse_fleet_spec("1x2xh100-sxm"), clock=clock)
    backend = fleet.node("sim-00").backend()
    backend.poll_events(0)  # registered for events, as the sampler's first poll does
    fleet.inject(Fault(FaultKind.XID, node="sim-00", gpu=1, params={"xid": 79}))
    clock.advance(1.0)
    report = run_level1(backend, clock, Severity.OK, ())
    assert report.status.value == "pass", [r.message for r in report.failures()]
    assert {r.test for r in report.results} >= {"software", "ecc", "health_rules"}
    events = backend.poll_events(0)  # still there for the sampler
    assert [(e.gpu_index, e.xid) for e in events if e.kind == "xid"] == [(1, 79)]
    assert backend.device_count() == 2  # the library is still initialised
    unknown = run_level1(backend, clock, Severity.UNKNOWN, ())
    assert [r.status.value for r in unknown.results if r.test == "health_rules"] == ["fail"]
