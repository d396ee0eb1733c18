"""`power apply` and `power restore`: set limits through NVML, remembering the previous ones in
a 0600 state file (in a 0700 directory) so that `restore` puts them back."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError, UsageError
from gpufleet.private import private_dir, private_file


def default_state_file() -> Path:
    """``$XDG_STATE_HOME/gpufleet/power-limits.json`` (``~/.local/state`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpufleet" / "power-limits.json"


def read_state(path: Path) -> dict[str, dict[str, float]]:
    """node -> {gpu index: previous limit W}; empty when there is no file."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a gpufleet power state file: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("previous"), dict):
        raise ConfigError(f"{path}: not a gpufleet power state file (no 'previous')")
    return {str(n): {str(g): float(w) for g, w in v.items()} for n, v in data["previous"].items()}


def write_state(path: Path, previous: dict[str, dict[str, float]]) -> None:
    private_dir(path.parent)
    private_file(path)
    path.write_text(json.dumps({"previous": previous}, indent=1) + "\n", encoding="utf-8")


def recommended_limit(path: Path) -> float:
    """The recommended limit of a ``power sweep --json`` file."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        limit = data["recommendation"]["limit_w"]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read a sweep result: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: no recommendation.limit_w (a power sweep --json file?)"
        ) from exc
    if not isinstance(limit, int | float) or limit <= 0:
        raise ConfigError(f"{path}: recommendation.limit_w is not a number of watts")
    return float(limit)


def apply_limit(
    backend: Any, gpus: Sequence[int], watts: float, state: Path, *, dry_run: bool = False
) -> list[dict[str, Any]]:
    """Set ``watts`` on each GPU; the first apply records the previous limits (a later one keeps
    the originals, so restore always goes back to before gpufleet touched them)."""
    node = str(backend.node_name)
    rows: list[dict[str, Any]] = []
    for g in gpus:
        rng = backend.power_limit_constraints_w(g)
        if rng is not None and not rng[0] <= watts <= rng[1]:
            raise UsageError(
                f"--limit {watts:g} W is outside GPU {g}'s allowed {rng[0]:g}-{rng[1]:g} W"
            )
        rows.append({"node": node, "gpu": g, "from_w": backend.power_limit_w(g), "to_w": watts})
    if dry_run:
        return rows
    previous = read_state(state)
    mine = previous.setdefault(node, {})
    for r in rows:
        if r["from_w"] is not None:
            mine.setdefault(str(r["gpu"]), float(r["from_w"]))
    write_state(state, previous)  # before setting: a crash halfway can still be restored
    for r in rows:
        backend.set_power_limit_w(r["gpu"], watts)
    return rows


def restore(backend: Any, state: Path, *, dry_run: bool = False) -> list[dict[str, Any]]:
    """Put back the limits recorded for this node, then forget them."""
    previous = read_state(state)
    node = str(backend.node_name)
    mine = previous.get(node, {})
    if not mine:
        raise UsageError(f"{state}: nothing recorded for {node}; nothing to restore")
    rows = [
        {"node": node, "gpu": int(g), "from_w": backend.power_limit_w(int(g)), "to_w": w}
        for g, w in sorted(mine.items(), key=lambda kv: int(kv[0]))
    ]
    if dry_run:
        return rows
    for r in rows:
        backend.set_power_limit_w(r["gpu"], r["to_w"])
    del previous[node]
    write_state(state, previous)
    return rows


def _error_text(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__


def apply_each(backend: Any, limits: dict[int, float], state: Path) -> list[dict[str, Any]]:
    """Set each GPU's own limit, GPU by GPU (the agent's fleet-wide apply): a GPU NVML refuses
    (no permission, out of range, lost) gets its error in its row and the others are still
    set. Previous limits are recorded before anything is set, as `apply_limit` does."""
    node = str(backend.node_name)
    rows: list[dict[str, Any]] = []
    for g, watts in sorted(limits.items()):
        try:
            before = backend.power_limit_w(g)
        except Exception as exc:  # a lost GPU: nothing to set or record
            rows.append(
                {"gpu": g, "from_w": None, "to_w": None, "ok": False, "error": _error_text(exc)}
            )
            continue
        rows.append({"gpu": g, "from_w": before, "to_w": watts, "ok": False, "error": None})
    previous = read_state(state)
    mine = previous.setdefault(node, {})
    fresh: set[str] = set()  # recorded by this apply (forgotten again if NVML refuses)
    for r in rows:
        key = str(r["gpu"])
        if r["from_w"] is not None and r["to_w"] is not None and key not in mine:
            mine[key] = float(r["from_w"])
            fresh.add(key)
    write_state(state, previous)
    refused = False
    for r in rows:
        if r["to_w"] is None:
            continue
        try:
            backend.set_power_limit_w(r["gpu"], r["to_w"])
        except Exception as exc:
            r.update(ok=False, error=_error_text(exc), to_w=r["from_w"])
            if str(r["gpu"]) in fresh:  # unchanged: nothing for a restore to put back
                del mine[str(r["gpu"])]
                refused = True
        else:
            r["ok"] = True
    if refused:
        if not mine:
            previous.pop(node, None)
        write_state(state, previous)
    return rows


def restore_each(backend: Any, gpus: list[int] | None, state: Path) -> list[dict[str, Any]]:
    """Put back the recorded limits of ``gpus`` (None: every recorded GPU), GPU by GPU, then
    forget those that were put back; a GPU with nothing recorded is left as it is."""
    previous = read_state(state)
    node = str(backend.node_name)
    mine = previous.get(node, {})
    wanted = sorted(int(g) for g in mine) if gpus is None else sorted(gpus)
    rows: list[dict[str, Any]] = []
    for g in wanted:
        to = mine.get(str(g))
        try:
            before = backend.power_limit_w(g)
            if to is None:
                rows.append({"gpu": g, "from_w": before, "to_w": before, "ok": True, "error": None})
                continue
            backend.set_power_limit_w(g, to)
        except Exception as exc:
            rows.append(
                {"gpu": g, "from_w": None, "to_w": None, "ok": False, "error": _error_text(exc)}
            )
            continue
        rows.append({"gpu": g, "from_w": before, "to_w": to, "ok": True, "error": None})
        del mine[str(g)]
    if not mine:
        previous.pop(node, None)
    write_state(state, previous)
    return rows
