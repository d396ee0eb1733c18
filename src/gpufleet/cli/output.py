"""Shared CLI output helpers: one console, JSON emission, error printing, N/A rendering."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)

NA = "N/A"


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, pydantic models, enums, paths, tuples and sets to plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return to_jsonable(obj.model_dump(mode="json"))
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and obj != obj:  # NaN is not JSON
        return None
    return obj


def emit_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout (no Rich markup, safe to pipe)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    """Render a possibly-missing value for a table: ``None`` becomes N/A."""
    if value is None:
        return NA
    if isinstance(value, float):
        value = f"{value:.{digits}f}"
    return f"{value}{unit}"
