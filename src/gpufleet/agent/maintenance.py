"""The agent's part of a maintenance campaign (issue 15): run the site's update command once
per order, detached, and report how it ended.

When an ``Ack`` carries an update order (`gpufleet.wire.WireUpdateOrder`) whose key this node
has not run yet, the agent

1. writes ``STATE/maintenance/KEY.started.json`` (so the key never runs twice, even after a
   restart of the agent or of the controller that sent it again),
2. stops sampling and shuts NVML down (a driver update unloads the kernel module, which needs
   the devices free),
3. starts the unit (`gpufleet.agent.update_unit`) detached from itself: under
   ``systemd-run --unit=... --collect`` when systemd runs the host and the agent is root,
   else as an orphaned process in its own session; it outlives the agent,
4. posts the unit's result (``KEY.result.json``) to ``POST /api/v1/maintenance/reports`` until
   the controller takes it, then asks to be restarted (`restart_wanted`): the agent process
   re-executes itself, opens NVML again and reports the devices' new versions, which the
   controller checks against the baseline. It does so also when it was restarted during the
   update: the controller judges only a description of the GPUs sent after it had the outcome.

A result file found at start (the update ended while the agent was down) is reported the same
way. The command should not reboot the node itself before it exits (schedule the reboot,
e.g. ``shutdown -r +1``): a unit killed by a reboot writes no result, and the campaign fails the
node after its update timeout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.report_post import post_report
from gpufleet.agent.update_unit import result_path, write_private
from gpufleet.wire import WireUpdateOrder, WireUpdateReport

log = logging.getLogger("gpufleet.agent.maintenance")
INSTANCE = uuid.uuid4().hex  # this agent process (a restart or re-exec makes a new one)
REPORT_PATH = "/api/v1/maintenance/reports"


def use_systemd() -> bool:
    """Start units with systemd-run: root on a host that systemd runs (GPUFLEET_UPDATE_SYSTEMD
    = 0 turns it off)."""
    if os.environ.get("GPUFLEET_UPDATE_SYSTEMD", "1") == "0":
        return False
    return (
        os.geteuid() == 0
        and Path("/run/systemd/system").is_dir()
        and shutil.which("systemd-run") is not None
    )


class AgentMaintenance:
    """Update orders of one agent: started once per key, reported until the controller has it."""

    def __init__(
        self,
        state_dir: Path,
        node: str,
        controller: str,
        token: str,
        client: httpx.Client,
        *,
        close_devices: Callable[[], object],
        agent_pid: int | None = None,
    ) -> None:
        """``agent_pid``: given to the command as GPUFLEET_AGENT_PID (it may restart the
        agent); None for an agent inside a process of many (`gpufleet up`)."""
        self.root = state_dir / "maintenance"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.node = node
        self.url = controller.rstrip("/") + REPORT_PATH
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "gpufleet-agent"}
        self.client = client
        self.close_devices = close_devices
        self.agent_pid = agent_pid
        self.updating = threading.Event()  # sampling paused: NVML is shut down
        self.restart_wanted = threading.Event()
        self._lock = threading.Lock()
        if any(not result_path(self.root, k).exists() for k in self._unreported()):
            self.updating.set()  # a unit still runs (the agent restarted during its update)

    def _started(self, key: str) -> Path:
        return self.root / f"{key}.started.json"

    def _reported(self, key: str) -> Path:
        return self.root / f"{key}.reported"

    def _unreported(self) -> list[str]:
        keys = [p.name[: -len(".started.json")] for p in self.root.glob("*.started.json")]
        return sorted(k for k in keys if not self._reported(k).exists())

    # -- an order arrives (pusher thread) -------------------------------------------------------
    def order(self, order: WireUpdateOrder) -> bool:
        """Start the order's unit unless its key ran already; True when started now."""
        with self._lock:
            marker = self._started(order.key)
            if marker.exists():
                return False
            write_private(marker, {"key": order.key, "at_s": time.time(), "agent": INSTANCE})
            self.updating.set()
            try:
                self.close_devices()  # NVML shut down before the driver goes
            except Exception:
                log.exception("closing the devices before the update failed")
            argv = [
                sys.executable,
                "-m",
                "gpufleet.agent.update_unit",
                str(self.root),
                order.key,
                f"{order.timeout_s:g}",
                order.command,
            ]
            env = {
                **os.environ,
                "GPUFLEET_NODE": self.node,
                "GPUFLEET_UPDATE_KEY": order.key,
            }
            env.pop("GPUFLEET_AGENT_PID", None)
            if self.agent_pid is not None:
                env["GPUFLEET_AGENT_PID"] = str(self.agent_pid)
            if use_systemd():
                unit = f"gpufleet-update-{order.key}"
                argv = ["systemd-run", f"--unit={unit}", "--collect", "--quiet", *argv]
                env["GPUFLEET_UPDATE_NO_FORK"] = "1"
            log.warning("maintenance: running update %s: %s", order.key, order.command)
            try:
                subprocess.run(  # returns at once: the unit forks away (or systemd owns it)
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=False,
                    timeout=60,
                    start_new_session=True,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                write_private(
                    result_path(self.root, order.key),
                    {
                        "key": order.key,
                        "exit_code": None,
                        "timed_out": False,
                        "output_tail": f"could not start the update unit: {exc}",
                    },
                )
            return True

    # -- reporting (push thread, before each batch) ---------------------------------------------
    def poll(self) -> None:
        """Report finished units; after a report, ask for a restart (NVML opens fresh)."""
        for key in self._unreported():
            res = result_path(self.root, key)
            if not res.exists():
                continue
            try:
                doc: dict[str, Any] = json.loads(res.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            report = WireUpdateReport(
                node=self.node,
                key=key,
                exit_code=doc.get("exit_code"),
                timed_out=bool(doc.get("timed_out")),
                output_tail=str(doc.get("output_tail") or "")[-4000:],
                started_s=doc.get("started_s"),
                ended_s=doc.get("ended_s"),
            )
            reported = self._reported(key)
            if not post_report(
                self.client, self.url, self._headers, report, reported, "maintenance"
            ):
                continue
            log.warning("maintenance: update %s ended (exit %s)", key, report.exit_code)
            # start afresh when NVML was shut down in this process, and after a success also
            # when this process began after the update: the controller takes the node as back
            # only when its GPUs are described after it has the outcome (a restart sends them)
            if self.updating.is_set() or report.exit_code == 0:
                self.restart_wanted.set()
