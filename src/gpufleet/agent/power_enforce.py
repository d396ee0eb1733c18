"""Keeping a fleet power order's limits in force on a node (issue 16).

A GPU's power limit lives in the driver: a reboot or a driver reload puts it back to the
board's default, and ``nvidia-smi -pl`` can change it under gpufleet's feet, while the order
on the controller still reads ``ok``. `PowerEnforcer` keeps, in ``STATE/power/in-force.json``
(0600, written atomically), the limit each GPU should have from the orders the agent applied
successfully (GPU -> watts and the order's key). The agent's power thread calls `check` at
start (after the first answer from the controller, so a restore that waited there runs
first) and then every ``--power-check-interval`` seconds: each GPU whose limit differs from
its in-force limit gets it set again, with a warning in the log and a device event
``power_limit_reapplied`` in the next batch ("power limit re-applied on gpu 0: 700 W -> 500 W
(order po3-n1-apply)"). GPUs without an in-force limit are never touched, and the limits
recorded before gpufleet changed anything (``limits.json``, what a restore puts back) are never
written here.

A GPU whose set-limit call NVML refuses (no permission, out of range), whose limit NVML cannot
read, or whose limit does not read back as set is logged and reported once (event
``power_limit_reapply_failed``), then tried again only after a backoff that doubles up to an
hour (`MAX_BACKOFF_S`), never on every check.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.update_unit import write_private
from gpufleet.wire import WireEvent

log = logging.getLogger("gpufleet.agent.power")

IN_FORCE_FILE = "in-force.json"
DEFAULT_CHECK_INTERVAL_S = 60.0
TOLERANCE_W = 1.0  # NVML keeps milliwatts; a driver may round a limit to whole watts
MAX_BACKOFF_S = 3600.0
MAX_EVENTS = 1000  # events waiting for a batch (the oldest dropped beyond)
REAPPLIED, FAILED = "power_limit_reapplied", "power_limit_reapply_failed"


@dataclass
class _Refusal:
    """A GPU whose in-force limit could not be put back: when to try again."""

    watts: float
    key: str
    failures: int
    retry_at: float


def _fmt(w: float | None) -> str:
    return "unknown" if w is None else f"{w:g} W"


def _text(exc: Exception) -> str:
    return (str(exc).strip() or type(exc).__name__)[:500]


class PowerEnforcer:
    """The limits in force on one node's GPUs, and putting them back where they drifted."""

    def __init__(
        self,
        root: Path,
        backend: Any,
        interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = root / IN_FORCE_FILE
        self.backend = backend
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._events: list[WireEvent] = []
        self._refused: dict[int, _Refusal] = {}
        self.reapplied = 0  # limits put back since the agent started
        self.gpus = self._read()

    # -- the in-force file ----------------------------------------------------------------------
    def _read(self) -> dict[int, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            return {
                int(g): {"watts": float(e["watts"]), "key": str(e["key"])}
                for g, e in doc["gpus"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # fail-safe: an unreadable file enforces nothing rather than a wrong limit
            log.error("power: %s unreadable (%s); no limit kept in force", self.path, exc)
            return {}

    def _save(self) -> None:
        gpus = {str(g): e for g, e in sorted(self.gpus.items())}
        write_private(self.path, {"gpus": gpus})

    def applied(self, key: str, rows: list[dict[str, Any]]) -> None:
        """An apply ended: the GPUs NVML set are now held at their new limit for ``key``."""
        changed = False
        for r in rows:
            if r.get("ok") and r.get("to_w") is not None:
                self.gpus[int(r["gpu"])] = {"watts": float(r["to_w"]), "key": key}
                self._refused.pop(int(r["gpu"]), None)
                changed = True
        if changed:
            self._save()

    def restored(self, apply_key: str | None, rows: list[dict[str, Any]]) -> None:
        """A restore ended: its order's entries and the GPUs it put back are held no more."""
        drop = {g for g, e in self.gpus.items() if apply_key is not None and e["key"] == apply_key}
        drop |= {int(r["gpu"]) for r in rows if r.get("ok") and int(r["gpu"]) in self.gpus}
        for g in drop:
            del self.gpus[g]
            self._refused.pop(g, None)
        if drop:
            self._save()

    # -- the check (power thread) ---------------------------------------------------------------
    def check(self) -> int:
        """Put back every in-force limit that differs from the GPU's; the number put back."""
        done = 0
        now = self.clock()
        for g, e in sorted(self.gpus.items()):
            want, key = float(e["watts"]), str(e["key"])
            ref = self._refused.get(g)
            if ref is not None and (ref.watts, ref.key) == (want, key) and now < ref.retry_at:
                continue
            try:
                before = self.backend.power_limit_w(g)
            except Exception as exc:  # a lost GPU, NVML gone
                self._failed(g, want, key, None, f"reading the limit failed: {_text(exc)}", now)
                continue
            if before is None:  # NVML does not say: nothing to compare, nothing set
                continue
            if abs(float(before) - want) < TOLERANCE_W:
                if self._refused.pop(g, None) is not None:
                    log.warning("power: gpu %d holds %s again (order %s)", g, _fmt(want), key)
                continue
            try:
                self.backend.set_power_limit_w(g, want)
                after = self.backend.power_limit_w(g)
            except Exception as exc:
                self._failed(g, want, key, before, _text(exc), now)
                continue
            if after is not None and abs(float(after) - want) >= TOLERANCE_W:
                self._failed(g, want, key, before, f"NVML reads {_fmt(after)} after setting", now)
                continue
            self._refused.pop(g, None)
            self.reapplied += 1
            done += 1
            detail = (
                f"power limit re-applied on gpu {g}: {_fmt(before)} -> {_fmt(want)} (order {key})"
            )
            log.warning("power: %s", detail)
            self._event(g, REAPPLIED, detail)
        return done

    def _failed(
        self, g: int, want: float, key: str, before: float | None, why: str, now: float
    ) -> None:
        ref = self._refused.get(g)
        if ref is None or (ref.watts, ref.key) != (want, key):
            ref = self._refused[g] = _Refusal(want, key, 0, now)
        ref.failures += 1
        wait = min(MAX_BACKOFF_S, max(self.interval_s, 1.0) * 2.0**ref.failures)
        ref.retry_at = now + wait
        detail = (
            f"power limit re-apply refused on gpu {g}: {_fmt(before)} -> {_fmt(want)} "
            f"(order {key}): {why}; next try in {wait:.0f} s"
        )
        if ref.failures == 1:  # reported once; the retries only log
            log.warning("power: %s", detail)
            self._event(g, FAILED, detail)
        else:
            log.info("power: %s (try %d)", detail, ref.failures)

    def _event(self, g: int, kind: str, detail: str) -> None:
        ev = WireEvent(gpu_index=g, kind=kind, timestamp_s=time.time(), detail=detail)
        with self._lock:
            self._events.append(ev)
            del self._events[: max(0, len(self._events) - MAX_EVENTS)]

    def take_events(self) -> list[WireEvent]:
        """The events not sent yet (the pusher thread, building a batch)."""
        with self._lock:
            out, self._events = self._events, []
        return out
