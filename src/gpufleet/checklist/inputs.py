"""Reading the checklist's evidence files: `gpufleet plan --json`, `gpufleet inventory --json`,
`gpufleet validate --out` and `gpufleet doctor --json`, each with a clear error naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError

MAX_BYTES = 64 * 2**20


def load_json(path: Path, option: str) -> dict[str, Any]:
    """A JSON object from ``path``; ConfigError naming the option, the file and the line."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ConfigError(f"{option} {path}: larger than {MAX_BYTES // 2**20} MiB")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{option} {path}: not UTF-8 text") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option} {path}: line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{option} {path}: expected a JSON object")
    return doc


def chosen_candidate(plan: dict[str, Any], where: str) -> dict[str, Any]:
    """The candidate the plan chose (`gpufleet plan --json`: ``chosen`` names one of
    ``candidates[].candidate``)."""
    chosen = plan.get("chosen")
    candidates = plan.get("candidates")
    for cand in candidates if isinstance(candidates, list) else []:
        if isinstance(cand, dict) and cand.get("candidate") == chosen:
            return cand
    raise ConfigError(
        f"{where}: no candidate named by 'chosen' ({chosen!r})",
        hint="pass the output of `gpufleet plan SPEC --json`",
    )


def plan_port_gbps(plan: dict[str, Any], where: str) -> float | None:
    """The compute fabric's port rate of the chosen candidate (``fabric.port_gbps``)."""
    fabric = chosen_candidate(plan, where).get("fabric")
    rate = fabric.get("port_gbps") if isinstance(fabric, dict) else None
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
