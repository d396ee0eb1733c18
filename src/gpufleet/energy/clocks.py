"""The power tuner's second knob: sweep locked SM clocks (nvmlDeviceSetGpuLockedClocks over the
supported graphics clocks), as Zeus and Perseus tune the GPU frequency, and always unlock them.

A lock outlives the process that set it (until reset, reboot or driver reload: NVML API
Reference, nvmlDeviceSetGpuLockedClocks), so each lock is recorded in a 0600 state file *before*
it is set, and forgotten once reset. The sweep resets in a ``finally``; after a crash (SIGKILL,
power loss of the host's CPU side, OOM kill) the next `gpufleet agent` start or `power sweep`
resets what a dead process left locked (`recover_locked_clocks`). NVML cannot read a lock back,
so "restore" means reset to the driver default.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.energy.sweep import Progress, SweepPoint, SweepResult, limit_in_force, measure
from gpufleet.energy.workloads import Runner
from gpufleet.errors import ConfigError, DeviceError, UsageError
from gpufleet.private import private_dir, private_file

log = logging.getLogger("gpufleet.energy")
AUTO_FLOOR = 0.4  # `--clocks auto`: supported clocks from max down to 40 % of it
AUTO_POINTS = 12


@dataclass(frozen=True)
class ClockPoint(SweepPoint):
    """One locked clock's measurement (``limit_w``: the power limit in force meanwhile)."""

    clock_mhz: int | None = None


def default_clock_state_file() -> Path:
    """``$XDG_STATE_HOME/gpufleet/locked-clocks.json`` (``~/.local/state`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufleet" / "locked-clocks.json"


def read_clock_state(path: Path) -> dict[str, dict[str, dict[str, int]]]:
    """node -> {gpu index: {"pid", "min_mhz", "max_mhz"}}; empty when there is no file."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        locked = data["locked"]
        return {
            str(n): {str(g): {k: int(v) for k, v in rec.items()} for g, rec in gpus.items()}
            for n, gpus in locked.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a gpufleet locked-clocks state file: {exc}") from exc


def write_clock_state(path: Path, locked: dict[str, dict[str, dict[str, int]]]) -> None:
    """Write the records (0600 in a 0700 directory); an empty record set removes the file."""
    if not any(locked.values()):
        path.unlink(missing_ok=True)
        return
    private_dir(path.parent)
    private_file(path)
    path.write_text(json.dumps({"locked": locked}, indent=1) + "\n", encoding="utf-8")


def lock_clocks(
    backend: Any, gpus: Sequence[int], mhz: int, state: Path, *, pid: int | None = None
) -> None:
    """Record, then lock each GPU's graphics clock at ``mhz`` (min = max)."""
    node = str(backend.node_name)
    locked = read_clock_state(state)
    mine = locked.setdefault(node, {})
    for g in gpus:
        mine[str(g)] = {"pid": os.getpid() if pid is None else pid, "min_mhz": mhz, "max_mhz": mhz}
    write_clock_state(state, locked)  # before locking: a crash halfway is still reset later
    for k, g in enumerate(gpus):
        try:
            backend.lock_gpu_clocks_mhz(g, mhz, mhz)
        except BaseException:
            if previous := read_clock_state(state).get(node):  # refused: nothing to reset
                for rest in gpus[k:]:
                    previous.pop(str(rest), None)
                write_clock_state(state, {**read_clock_state(state), node: previous})
            raise


def reset_clocks(backend: Any, gpus: Sequence[int], state: Path) -> None:
    """Unlock every GPU (each tried), forget those unlocked; failures reported together."""
    node = str(backend.node_name)
    failed: list[str] = []
    done: list[int] = []
    for g in gpus:
        try:
            backend.reset_gpu_clocks(g)
        except DeviceError as exc:
            failed.append(str(exc))
        else:
            done.append(g)
    locked = read_clock_state(state)
    mine = locked.get(node, {})
    for g in done:
        mine.pop(str(g), None)
    if not mine:
        locked.pop(node, None)
    write_clock_state(state, locked)
    if failed:
        raise DeviceError(
            "could not reset the locked clocks: " + "; ".join(failed),
            hint=f"they stay recorded in {state}; `nvidia-smi -rgc` resets them by hand",
        )


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OverflowError:
        return False
    return True


def recover_locked_clocks(
    backend: Any, state: Path, *, alive: Callable[[int], bool] = pid_alive
) -> list[int]:
    """Reset the clocks this node's records say a process locked and did not reset, where
    that process is gone (or is this one: its earlier run); the GPUs reset. A sweep still
    running elsewhere keeps its locks."""
    try:
        mine = read_clock_state(state).get(str(backend.node_name), {})
    except ConfigError as exc:
        log.warning("locked clocks not recovered: %s", exc)
        return []
    stale = sorted(
        int(g) for g, rec in mine.items() if rec["pid"] == os.getpid() or not alive(rec["pid"])
    )
    if stale:
        reset_clocks(backend, stale, state)
        log.warning("GPU(s) %s: reset clocks a crashed sweep had locked", stale)
    return stale


def parse_clocks(text: str, supported: Sequence[int]) -> list[int]:
    """``auto``, ``1980,1905,...,990`` (a step inferred from the first two) or a list, in MHz;
    every clock must be one the GPU supports (``supported``, highest first)."""
    t = text.strip()
    top, bottom = max(supported), min(supported)
    if t.lower() == "auto":
        usable = [c for c in sorted(supported, reverse=True) if c >= AUTO_FLOOR * top]
        step = max(1, round(len(usable) / AUTO_POINTS))
        return usable[::step]
    parts = [p.strip().removesuffix("MHz").strip() for p in t.split(",") if p.strip()]
    try:
        if "..." in parts:
            if parts.index("...") != 2 or len(parts) != 4:
                raise UsageError("--clocks: write A,B,...,Z (first two give the step)")
            a, b, z = int(parts[0]), int(parts[1]), int(parts[3])
            if a == b or (z - a) * (b - a) < 0:
                raise UsageError(f"--clocks: {text!r} does not reach {z} MHz")
            out = list(range(a, z + (1 if b > a else -1), b - a))
        else:
            out = [int(p) for p in parts]
    except ValueError as exc:
        raise UsageError(f"--clocks: not a whole number of MHz in {text!r}") from exc
    if not out:
        raise UsageError("--clocks: give clocks in MHz, e.g. 1980,1830,...,990, or auto")
    bad = [c for c in out if c not in set(supported)]
    if bad:
        raise UsageError(
            f"--clocks: {', '.join(map(str, bad))} MHz not among the GPU's supported clocks "
            f"({bottom}-{top} MHz; `nvidia-smi -q -d SUPPORTED_CLOCKS` lists them)"
        )
    return out


def supported_clocks(backend: Any, gpus: Sequence[int]) -> list[int]:
    """The clocks every one of ``gpus`` supports, highest first; DeviceError when NVML lists
    none for a GPU (the sweep could not know which clocks are valid)."""
    common: set[int] | None = None
    for g in gpus:
        clocks = backend.supported_graphics_clocks_mhz(g)
        if not clocks:
            raise DeviceError(
                f"GPU {g} on {backend.node_name}: NVML lists no supported graphics clocks; "
                "cannot sweep locked clocks"
            )
        common = set(clocks) if common is None else common & set(clocks)
    return sorted(common or (), reverse=True)


def sweep_clocks(
    backend: Any,
    gpus: Sequence[int],
    clocks: Sequence[int],
    runner: Runner,
    seconds: float,
    state: Path,
    *,
    progress: Progress | None = None,
) -> SweepResult:
    """Measure ``runner`` with the clocks locked at each of ``clocks``; reset them afterwards,
    whatever happens (error, Ctrl-C), as `sweep` restores the power limits."""
    limits = {g: backend.power_limit_w(g) for g in gpus}
    points: list[SweepPoint] = []
    locked = False
    try:
        for k, mhz in enumerate(clocks):
            if progress:
                progress(k, len(clocks), float(mhz))
            locked = True  # some GPUs may be locked even when the call fails halfway
            lock_clocks(backend, gpus, int(mhz), state)
            res, joules, method = measure(backend, gpus, runner, seconds)
            points.append(
                ClockPoint(
                    limit_w=limit_in_force(backend, gpus),
                    seconds=res.seconds,
                    work=sum(res.work.values()),
                    energy_j=joules,
                    energy_method=method,
                    clock_mhz=int(mhz),
                )
            )
        if progress:
            progress(len(clocks), len(clocks), None)
    except BaseException:
        if locked:
            try:
                reset_clocks(backend, gpus, state)
            except DeviceError as exc:  # the sweep's own error is the one to report
                log.error("%s", exc)
        raise
    if locked:
        reset_clocks(backend, gpus, state)
    return SweepResult(runner.unit, tuple(gpus), tuple(points), limits, restored=locked)
