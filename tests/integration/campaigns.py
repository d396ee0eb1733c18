"""The rig of the maintenance campaign tests over real processes (issue 15): a controller
process with a token per node, simulated agents restarted when they exit (as systemd does), a
site update script that "installs" the new driver and restarts the agent, and the campaign API
(start one, read it, wait for it to end)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from gpufleet.testing.procs import ControllerProcess, _env, _spawn, create_tokens
from gpufleet.testing.testbed import Controller, wait_for
from tests.integration.processes import terminate

OLD, NEW = "535.104.05", "550.90.07"

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

    extra_args: ClassVar[tuple[str, ...]] = ()  # on top of the agent command line below

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
                *("--push-interval", "0.25", *self.extra_args),
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
            terminate(self.proc)


def controller(tmp_path: Path, nodes: list[str]) -> tuple[ControllerProcess, dict[str, str]]:
    """A started controller process on ``tmp_path/ctl``, and the tokens: ``admin`` (the
    controller's) and one agent token bound to each node."""
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None), **{n: ("agent", n) for n in nodes}})
    return ControllerProcess(data, tokens["admin"]).start(), tokens


def update_script(tmp_path: Path) -> tuple[Path, Path]:
    """The site update script (`SCRIPT`, OLD to NEW) as ``tmp_path/site-update.sh``, and the
    log each of its runs appends ``NODE KEY`` to."""
    log = tmp_path / "updates.log"
    script = tmp_path / "site-update.sh"
    script.write_text(SCRIPT.format(log=log, old=OLD, new=NEW), encoding="utf-8")
    script.chmod(0o700)
    return script, log


def body(command: str, **fields: Any) -> dict[str, Any]:
    """A campaign to the NEW driver that runs ``command`` as each node's update: one failure
    allowed, and the step timeouts most tests use (update 60 s, back 60 s, verify 30 s,
    validate 90 s); ``fields`` add to these or replace them."""
    return {
        "baseline": {"models": {"h100-sxm": {"driver": NEW}}},
        "max_failures": 1,
        "update_command": command,
        "update_timeout_s": 60,
        "back_timeout_s": 60,
        "verify_timeout_s": 30,
        "validate_timeout_s": 90,
        **fields,
    }


def start(ctl: ControllerProcess | Controller, body: dict[str, Any]) -> dict[str, Any]:
    """POST the campaign (it must be created: 201) and return the controller's answer."""
    r = ctl.call("POST", "/api/v1/maintenance/campaigns", json=body)
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def status(ctl: ControllerProcess | Controller, cid: object) -> dict[str, Any]:
    """The campaign's document as the API shows it now."""
    doc: dict[str, Any] = ctl.call("GET", f"/api/v1/maintenance/campaigns/{cid}").json()
    return doc


def wait_ended(
    ctl: ControllerProcess | Controller, cid: object, timeout_s: float, what: str = "campaign ended"
) -> dict[str, Any]:
    """The campaign's document once it is no longer running."""
    wait_for(lambda: status(ctl, cid)["state"] != "running", timeout_s, what, step_s=0.5)
    return status(ctl, cid)
