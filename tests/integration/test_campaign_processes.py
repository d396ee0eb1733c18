"""A maintenance campaign over real processes (issue 15): a controller and three simulated
agents, whose update command is a real script. The script changes the node's driver version in
the fleet file the simulator reads and restarts the agent (as ``systemctl restart`` would: it
kills the agent; a supervisor here starts it again). The controller is killed with SIGKILL
mid-campaign and started again on the same database. In the end every node is at the baseline,
in service and uncordoned, each node's update ran exactly once, and in-service capacity never
went below the floor.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.procs import ControllerProcess, _env, _spawn, create_tokens
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled

OLD, NEW = "535.104.05", "550.90.07"
pytestmark = pytest.mark.process


NODES = ["cm0", "cm1", "cm2"]

SCRIPT = """#!/bin/sh
# a site's update script: "install" the new driver, log the run, restart the agent
set -e
echo "$GPUFLEET_NODE $GPUFLEET_UPDATE_KEY" >> "{log}"
sed -i 's/{old}/{new}/' ../fleet.yaml
echo "driver {new} installed on $GPUFLEET_NODE"
kill -TERM "$GPUFLEET_AGENT_PID"
"""


class SupervisedAgent:
    """An agent process started again whenever it exits (systemd's Restart=always)."""

    def __init__(
        self,
        node: str,
        url: str,
        token: str,
        state_dir: Path,
        faults: list[dict[str, Any]] | None = None,
    ) -> None:
        self.node, self.url, self.token, self.state_dir = node, url, token, state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "nodes": [{"name": node, "model": "h100-sxm", "gpus": 2, "driver_version": OLD}]
        }
        if faults:
            doc["faults"] = [{"node": node, **f} for f in faults]
        (state_dir / "fleet.yaml").write_text(json.dumps(doc), encoding="utf-8")
        self.starts = 0
        self.stopping = threading.Event()
        self.proc = self._start()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        return _spawn(
            [
                *("agent", "--sim", str(self.state_dir / "fleet.yaml")),
                *("--listen", "127.0.0.1:0", "--controller", self.url),
                *("--state-dir", str(self.state_dir), "--fast-interval", "0.25"),
                *("--push-interval", "0.25"),
            ],
            self.state_dir / f"agent-{self.starts}.log",
            {**_env(), "GPUFLEET_AGENT_TOKEN": self.token, "GPUFLEET_UPDATE_SYSTEMD": "0"},
        )

    def _watch(self) -> None:
        while not self.stopping.is_set():
            if self.proc.poll() is not None and not self.stopping.is_set():
                time.sleep(0.3)
                self.proc = self._start()
            time.sleep(0.1)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a node the update left hanging
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_campaign_with_a_real_update_script_and_a_controller_kill(tmp_path: Path) -> None:
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None), **{n: ("agent", n) for n in NODES}})
    ctl = ControllerProcess(data, tokens["admin"]).start()
    log = tmp_path / "updates.log"
    script = tmp_path / "site-update.sh"
    script.write_text(SCRIPT.format(log=log, old=OLD, new=NEW), encoding="utf-8")
    script.chmod(0o700)
    agents = [SupervisedAgent(n, ctl.url, tokens[n], tmp_path / n) for n in NODES]
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)
        body = {
            "baseline": {"models": {"h100-sxm": {"driver": NEW}}},
            "batch": 2,
            "floor": 0.3,
            "max_failures": 1,
            "update_command": str(script),
            # the step timeouts are what the campaign counts a node failed by, the controller's
            # restart and a loaded machine's slow agent re-exec included: each far above a
            # passing run's (a few seconds), scaled with the tests' time scale
            "update_timeout_s": scaled(120),
            "back_timeout_s": scaled(120),
            "verify_timeout_s": scaled(90),
            "validate_timeout_s": scaled(120),
        }
        r = ctl.call("POST", "/api/v1/maintenance/campaigns", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert {n["node"] for n in r.json()["nodes"]} == set(NODES)
        dips: list[Any] = []  # what the nodes were when capacity read below the floor

        def status() -> dict[str, Any]:
            doc: dict[str, Any] = ctl.call("GET", f"/api/v1/maintenance/campaigns/{cid}").json()
            frac = doc["capacity"]["in_service_fraction"]
            if frac is not None and frac < 0.3 - 1e-9:
                nodes = ctl.call("GET", "/api/v1/nodes").json()
                rows = nodes["nodes"] if isinstance(nodes, dict) else nodes
                events = ctl.call("GET", "/api/v1/events", params={"limit": 30}).json()
                dips.append(
                    (
                        {k: v for k, v in doc["capacity"].items() if k != "history"},
                        [(n["node"], n["step"]) for n in doc["nodes"]],
                        [(r.get("name"), r.get("state"), r.get("cordoned")) for r in rows],
                        [(e.get("node"), e.get("message")) for e in events],
                    )
                )
            return doc

        def some_updating() -> bool:
            return any(n["step"] in ("updating", "rebooting") for n in status()["nodes"])

        wait_for(some_updating, 90, "a node in its update")
        ctl.kill9()
        ctl.start()

        def ended() -> bool:
            return bool(status()["state"] != "running")

        wait_for(ended, 300, "campaign ended", step_s=0.5)
        doc = status()
        steps = [(n["node"], n["step"], n.get("reason")) for n in doc["nodes"]]
        assert doc["state"] == "done", f"{doc['reason']}; nodes {steps}\n{_logs(tmp_path)}"
        assert {n["step"] for n in doc["nodes"]} == {"done"}, doc["nodes"]
        runs = log.read_text(encoding="utf-8").split()
        assert sorted(runs[0::2]) == NODES  # each node's update ran exactly once
        nodes = ctl.call("GET", "/api/v1/nodes").json()
        items = nodes["nodes"] if isinstance(nodes, dict) else nodes
        for item in items:
            assert item["state"] == "in_service" and not item["cordoned"], item
        # floor 30 % of 6 GPUs: at most 2 nodes out at once -> never below 1/3
        assert not dips, f"capacity below the floor: {dips}\n{_logs(tmp_path)}"
        for a in agents:
            # the script restarted it (a supervisor start, or the agent's own re-exec when its
            # report of the update went out before it stopped)
            logs = "".join(p.read_text() for p in a.state_dir.glob("agent-*.log"))
            assert logs.count(f"gpufleet agent on {a.node}") >= 2
            fleet = json.loads((a.state_dir / "fleet.yaml").read_text(encoding="utf-8"))
            assert fleet["nodes"][0]["driver_version"] == NEW
    finally:
        for a in agents:
            a.stop()
        ctl.stop()


def _logs(root: Path) -> str:
    """The tail of every process log under ``root``: what a failed run is read from."""
    return "\n".join(
        f"--- {p.relative_to(root)}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
        for p in sorted(root.rglob("*.log"))
    )
