"""The CLI as the tests run it: in this process through typer's runner (`cli_json`), or as a
user runs it (`run_gpufleet`): ``python -m gpufleet`` on this tree's sources in a child process,
with colour off and 200 columns (the CLI's lines as they are, unwrapped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gpufleet.cli.app import app

SRC = Path(__file__).resolve().parents[1] / "src"
runner = CliRunner()


def cli_json(*args: str) -> dict[str, Any]:
    """``gpufleet ARGS --json`` in this process (it must succeed): the JSON object it printed."""
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


def plain_env() -> dict[str, str]:
    """The test's environment with this tree's sources on the path, NO_COLOR and COLUMNS=200."""
    return {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1", "COLUMNS": "200"}


def run_gpufleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``gpufleet ARGS`` (in ``env``, else `plain_env`) to its end, within 120 s: its exit
    code, stdout and stderr, whatever the code."""
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args],
        capture_output=True,
        text=True,
        env=plain_env() if env is None else env,
        timeout=120,
        check=False,
    )
