"""`gpufleet checklist --html F --md G` writes both files in one run (one checklist, two forms);
the same file named twice is refused before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import UsageError
from tests.cli import cli_json

PILOT = Path(__file__).parents[1] / "src" / "gpufleet" / "plan" / "examples" / "pilot-8gpu.yaml"
runner = CliRunner()


def test_html_and_md_together_write_both(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(cli_json("plan", str(PILOT))))
    html, md = tmp_path / "c.html", tmp_path / "c.md"
    res = runner.invoke(
        app, ["checklist", "--plan", str(plan), "--html", str(html), "--md", str(md)]
    )
    assert res.exit_code == 0, res.output
    flat = "".join(res.output.split())  # the console wraps long paths
    assert f"wrote{html}" in flat and f"{md}:" in flat
    page, text = html.read_text(), md.read_text()
    # the same checklist twice: every Markdown item "- [ ]"/"- [x]" is one HTML checkbox
    items = len(re.findall(r"^\s*- \[[ x]\] ", text, flags=re.MULTILINE))
    assert items > 0 and len(re.findall(r"<input type=checkbox", page)) == items
    assert text.startswith("# Deployment checklist")


def test_html_and_md_naming_one_file_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(cli_json("plan", str(PILOT))))
    same = tmp_path / "c.out"
    res = runner.invoke(
        app, ["checklist", "--plan", str(plan), "--html", str(same), "--md", str(same)]
    )
    assert isinstance(res.exception, UsageError) and "same file" in str(res.exception)
    assert not same.exists()
