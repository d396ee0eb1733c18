"""Shared CLI output helpers: one console, JSON emission, error printing, N/A rendering."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from gpufleet.jsonable import to_jsonable as to_jsonable

# emoji off: a value such as "root:x:0" in a message or table is shown as written (no ":x:" emoji)
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

NA = "N/A"


def print_error(message: str, hint: str | None = None) -> None:
    """One ``error: message; hint`` line on stderr. The text is escaped: a message such as
    ``expected '[tenant:] N x PROFILE'`` must not lose its brackets to Rich markup."""
    text = escape(message) + (f"; {escape(hint)}" if hint else "")
    err_console.print(f"[bold red]error:[/] {text}", highlight=False, soft_wrap=True)


def fit(table: Table, on: Console | None = None) -> Table:
    """Fit a table to the terminal before wrapping its cells.

    When the table's natural width is wider than the console (an 80-column terminal), drop the
    vertical rules and cell padding: one space between columns, a rule under the header. Only
    if that is still too wide does Rich wrap cells. Returns the same table, for chaining.
    """
    con = on or console
    natural = Measurement.get(con, con.options.update(width=10**5), table).maximum
    if natural > con.width:
        table.box = box.SIMPLE_HEAD
        table.padding = (0, 0)
        table.show_edge = False
        table.pad_edge = False
    return table


def emit_json(obj: Any, *, line: bool = False) -> None:
    """Print ``obj`` as indented JSON on stdout (no Rich markup, safe to pipe).

    ``line=True`` prints it on one line instead: a stream of such lines is JSON Lines, what a
    repeating command (``status --watch --json``) prints.
    """
    text = json.dumps(to_jsonable(obj), separators=(",", ":")) if line else None
    if text is None:
        text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    """Render a possibly-missing value for a table: ``None`` becomes N/A."""
    if value is None:
        return NA
    if isinstance(value, float):
        value = f"{value:.{digits}f}"
    return f"{value}{unit}"
