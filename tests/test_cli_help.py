"""`--help` shows what a user types after each option, never typer's internal type tags."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
import typer.testing
from typer.testing import CliRunner

from gpufleet.cli.app import app

TAG = re.compile(r"<(bool|int|str|float|path|text)[^>]*>", re.IGNORECASE)


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    if hasattr(cmd, "commands"):  # a group (typer may bring its own click)
        for name, sub in cmd.commands.items():
            out.extend(_commands(sub, (*path, name)))
    return out


def test_no_command_help_shows_type_tags(monkeypatch: pytest.MonkeyPatch) -> None:
    root = typer.main.get_command(app)
    paths = _commands(root)
    assert len(paths) > 30  # every command and subcommand, not just the root
    # the runner builds the whole click tree from the Typer app on every invoke (0.2 s, 45
    # times): the tree built above serves them all
    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: root)
    runner = CliRunner()
    bad = {}
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        tags = TAG.findall(result.output)
        if tags:
            bad[" ".join(path)] = tags
    assert bad == {}


def test_flags_show_no_value_and_options_show_one() -> None:
    out = CliRunner().invoke(app, ["status", "--help"], env={"COLUMNS": "200"}).output
    busy = next(ln for ln in out.splitlines() if "--busy" in ln)
    assert re.search(r"--busy\s+With --sim", busy)  # a flag takes no value
    seed = next(ln for ln in out.splitlines() if "--seed" in ln)
    assert re.search(r"--seed\s+N\s", seed)
