"""Shared CLI output helpers: one console, JSON emission, error printing, N/A rendering."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from gpufleet.jsonable import to_jsonable as to_jsonable

console = Console()
err_console = Console(stderr=True)

NA = "N/A"


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
