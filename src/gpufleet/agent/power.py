"""The agent's part of a fleet-wide power order (issue 16): set or restore GPU power limits
through NVML once per order key, and report each GPU's outcome to the controller.

When an ``Ack`` carries power orders (`gpufleet.wire.WirePowerOrder`), each key this node has
not answered yet is queued for the agent's power thread (an NVML call that hangs never holds
the pusher). The thread

1. writes ``STATE/power/KEY.started.json``,
2. applies the limits GPU by GPU with the same code as ``gpufleet power apply``
   (`gpufleet.energy.apply.apply_each`): the previous limits go to ``STATE/power/limits.json``
   (0600) before anything is set, so ``restore`` puts back the limits from before gpufleet
   touched them; a GPU NVML refuses (no permission, out of range) gets NVML's error in its row,
3. writes ``KEY.result.json``, which the push thread posts to ``POST /api/v1/power/reports``
   until the controller takes it (``KEY.reported``).

A key with a result is never applied again: an order sent again (after a controller restart,
or before the report arrived) is answered with the recorded result. A ``restore`` for an order
whose ``apply`` never ran here marks that apply as cancelled, so a late apply is not made.
An agent killed between ``started`` and ``result`` applies the order again when it comes back
(setting a limit is idempotent and the first recorded previous limits are kept).

The limits an apply set are then kept in force (`gpufleet.agent.power_enforce`): the same
thread checks them after the first ``Ack`` (and its orders) and every ``check_interval_s``, and
sets again a limit a reboot, a driver reload or ``nvidia-smi -pl`` changed, reported as a device
event in the next batch.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.power_enforce import DEFAULT_CHECK_INTERVAL_S, PowerEnforcer
from gpufleet.agent.report_post import post_report
from gpufleet.agent.update_unit import write_private
from gpufleet.energy.apply import apply_each, restore_each
from gpufleet.wire import WireEvent, WirePowerOrder, WirePowerReport

log = logging.getLogger("gpufleet.agent.power")
REPORT_PATH = "/api/v1/power/reports"
_CHECK, _STOP = "check", "stop"  # the power thread's other work: check the limits, end


def apply_key_of(restore_key: str) -> str | None:
    """The apply key of an order's restore key (``...-restore`` -> ``...-apply``)."""
    return restore_key[: -len("restore")] + "apply" if restore_key.endswith("-restore") else None


class AgentPower:
    """Power orders of one agent: acted on once per key, reported until the controller has it."""

    def __init__(
        self,
        state_dir: Path,
        backend: Any,
        node: str,
        controller: str,
        token: str,
        client: httpx.Client,
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        """``check_interval_s``: how often the limits in force are checked; ``paused``: True
        while NVML must not be called (a maintenance update shut it down)."""
        self.root = state_dir / "power"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.limits_file = self.root / "limits.json"
        self.backend = backend
        self.node = node
        self.url = controller.rstrip("/") + REPORT_PATH
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "gpufleet-agent"}
        self.client = client
        self._queue: queue.Queue[WirePowerOrder | str] = queue.Queue()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None  # started by an order or a limit in force
        self.enforcer = PowerEnforcer(self.root, backend, check_interval_s)
        self.paused = paused
        self._first_ack = True  # the first Ack asks for a check (after its orders)
        self._next_check = time.monotonic() + check_interval_s  # if no Ack comes before
        # results the controller has not taken yet (a glob at start, then kept here, so a push
        # does not list the directory)
        self._unreported = {
            p.name[: -len(".result.json")]
            for p in self.root.glob("*.result.json")
            if not self._reported(p.name[: -len(".result.json")]).exists()
        }

    def _result(self, key: str) -> Path:
        return self.root / f"{key}.result.json"

    def _reported(self, key: str) -> Path:
        return self.root / f"{key}.reported"

    # -- orders arrive (pusher thread) ----------------------------------------------------------
    def orders(self, orders: list[WirePowerOrder]) -> bool:
        """Queue the keys not answered yet; True when one was queued now."""
        queued = False
        with self._lock:
            for o in orders:
                if self._result(o.key).exists():
                    # sent again: the controller lacks the result; report it again, never re-apply
                    if o.key not in self._unreported:
                        log.warning("power: order %s answered already; reporting again", o.key)
                        self._reported(o.key).unlink(missing_ok=True)
                        self._unreported.add(o.key)
                    continue
                if o.key in self._queued:
                    continue
                self._queued.add(o.key)
                self._queue.put(o)
                queued = True
            if queued:
                self._start()
        return queued

    def acked(self) -> None:
        """An ``Ack`` was applied (after its orders were queued): the first one starts the
        check of the limits in force, so a restore that waited on the controller runs first."""
        with self._lock:
            if not self._first_ack:
                return
            self._first_ack = False
            if self.enforcer.gpus:
                self._queue.put(_CHECK)
                self._start()

    def _start(self) -> None:
        """Start the power thread (under ``_lock``) unless it runs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="gpufleet-power", daemon=True)
            self._thread.start()

    def start(self) -> None:
        """Start the power thread now when limits are in force (an agent coming back after a
        reboot checks them even while the controller is unreachable)."""
        with self._lock:
            if self.enforcer.gpus:
                self._start()

    def close(self) -> None:
        """End the power thread (after the work it has)."""
        self._queue.put(_STOP)

    # -- the power thread ----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            wait = max(0.0, self._next_check - time.monotonic()) if self.enforcer.gpus else None
            try:
                o = self._queue.get(timeout=wait)
            except queue.Empty:
                o = _CHECK
            if o == _STOP:
                return
            if isinstance(o, str):
                self._check()
                continue
            try:
                self.run(o)
            except Exception:
                log.exception("power order %s failed", o.key)
            finally:
                with self._lock:
                    self._queued.discard(o.key)

    def _check(self) -> None:
        self._next_check = time.monotonic() + self.enforcer.interval_s
        if self.paused():
            return
        try:
            self.enforcer.check()
        except Exception:
            log.exception("power: checking the limits in force failed")

    def take_events(self) -> list[WireEvent]:
        """Re-applied (or refused) limits for the next batch (the pusher thread)."""
        return self.enforcer.take_events()

    def _gpus(self, limits: dict[str, float]) -> dict[int, float]:
        if "*" in limits:
            return {g: limits["*"] for g in range(int(self.backend.device_count()))}
        return {int(g): w for g, w in limits.items()}

    def run(self, o: WirePowerOrder) -> None:
        """Act on one order now (once per key) and write its result file."""
        if self._result(o.key).exists():
            return
        write_private(self.root / f"{o.key}.started.json", {"key": o.key, "at_s": time.time()})
        error: str | None = None
        rows: list[dict[str, Any]] = []
        try:
            if o.action == "apply":
                log.warning("power: applying order %s: %s", o.key, o.limits)
                rows = apply_each(self.backend, self._gpus(o.limits), self.limits_file)
                self.enforcer.applied(o.key, rows)
            else:
                applied = apply_key_of(o.key)
                if applied is not None and not self._result(applied).exists():
                    cancelled = "cancelled: restored before it was applied on this node"
                    self._write(applied, [], cancelled)
                self.enforcer.restored(applied, [])  # first: never held again, even on error
                log.warning("power: restoring order %s", o.key)
                gpus = None if "*" in o.limits else sorted(int(g) for g in o.limits)
                rows = restore_each(self.backend, gpus, self.limits_file)
                self.enforcer.restored(None, rows)
        except Exception as exc:  # NVML not there at all, state file unreadable...
            error = str(exc) or type(exc).__name__
        self._write(o.key, rows, error)

    def _write(self, key: str, rows: list[dict[str, Any]], error: str | None) -> None:
        doc: dict[str, object] = {"key": key, "gpus": rows, "error": error, "done_s": time.time()}
        write_private(self._result(key), doc)
        with self._lock:
            self._unreported.add(key)

    # -- reporting (push thread, before each batch) ---------------------------------------------
    def poll(self) -> None:
        """Post every result the controller has not taken yet."""
        with self._lock:
            keys = sorted(self._unreported)
        for key in keys:
            res = self._result(key)
            try:
                doc: dict[str, Any] = json.loads(res.read_text(encoding="utf-8"))
                report = WirePowerReport(
                    node=self.node,
                    key=key,
                    gpus=doc.get("gpus") or [],
                    error=(doc.get("error") or None) and str(doc["error"])[:500],
                    done_s=doc.get("done_s"),
                )
            except (OSError, ValueError) as exc:
                log.warning("power: result of %s unreadable: %s", key, exc)
                continue
            reported = self._reported(key)
            if not post_report(self.client, self.url, self._headers, report, reported, "power"):
                continue
            with self._lock:
                self._unreported.discard(key)
