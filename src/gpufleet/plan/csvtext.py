"""CSV text of the planner's tables (bill of materials, cable map): a header row of attribute
names, then one row per item, ``\\n`` line ends."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

__all__ = ["csv_table"]


def _cell(value: object) -> object:
    """A float as ``:g`` (``3``, ``2.5``), None as an empty cell, anything else as it is."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return value


def csv_table(columns: Sequence[str], items: Iterable[object]) -> str:
    """CSV text with the header ``columns``, then each item's attributes of those names."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows([_cell(getattr(item, name)) for name in columns] for item in items)
    return buf.getvalue()
