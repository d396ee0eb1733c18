"""The order test files run in: the longest first, so that with ``--dist loadfile`` (and
``--no-loadscope-reorder``: xdist would sort files by their number of tests) the workers of
``make test`` end together instead of one running the last long files alone.

Each file's weight is its time in the last full run, from ``tests/durations.json``
(`scripts/test-durations.py` writes it from a JUnit XML report); a file it does not know (new,
or renamed) weighs by its marks: one starting processes or a browser is counted as long, any
other as short. Tests keep their order within a file; only whole files move, so module
fixtures and a file's own test order are as in a serial run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_PROCESS_S = 10.0  # a process test file not in the record: about the median of those
UNKNOWN_FAST_S = 0.5


def load_weights(path: Path = DURATIONS) -> dict[str, float]:
    """``{test file path: seconds}``; empty when the record is missing or unreadable (the order
    then comes from the marks alone: a broken record must not stop the suite)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return {}
    return {str(k): float(v) for k, v in files.items() if isinstance(v, int | float)}


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def order_by_weight(items: list[pytest.Item], weights: dict[str, float]) -> None:
    """Reorder ``items`` in place: files by weight, heaviest first; stable within a file and
    among files of equal weight."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(file_of(item), []).append(item)

    def weight(name: str) -> float:
        if name in weights:
            return weights[name]
        slow = any(m in item.keywords for item in by_file[name] for m in ("process", "browser"))
        return UNKNOWN_PROCESS_S if slow else UNKNOWN_FAST_S

    ranked = sorted(by_file, key=lambda name: -weight(name))
    items[:] = [item for name in ranked for item in by_file[name]]
