"""`gpufleet checklist` prints the floor load as the planner does (issue 31): the fullest rack's
weight in kg and its floor loading in kg/m^2 against the floor rating (ANSI/TIA-942's 12 kPa
unless the spec set its own), "not known" without a weight, in Markdown, HTML and JSON alike;
never the raw float the plan's JSON holds."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.cli import cli_json

PILOT = Path(__file__).parents[2] / "src" / "gpufleet" / "plan" / "examples" / "pilot-8gpu.yaml"
runner = CliRunner()
# by hand: one NVIDIA DGX H100 (130.45 kg, its datasheet) in an APC AR3300 enclosure (134.09 kg,
# 600 x 1200 mm); ANSI/TIA-942's 12 kPa = 12000 / 9.80665 kg/m^2
RACK_KG = 130.45 + 134.09
LOAD_KG_M2 = RACK_KG / (0.6 * 1.2)
TIA_KG_M2 = 12000 / 9.80665


@pytest.fixture(scope="module")
def plan() -> dict[str, Any]:
    return cli_json("plan", str(PILOT))


def _facility(plan: dict[str, Any]) -> dict[str, Any]:
    f = next(c for c in plan["candidates"] if c["candidate"] == plan["chosen"])["facility"]
    assert isinstance(f, dict)
    return f


def _floor_lines(plan: dict[str, Any], tmp: Path) -> dict[str, str]:
    """The floor item as each output shows it: stdout (Markdown), --md, --html, --json."""
    src = tmp / "plan.json"
    src.write_text(json.dumps(plan))
    md, page = tmp / "c.md", tmp / "c.html"
    out: dict[str, str] = {}
    res = runner.invoke(app, ["checklist", "--plan", str(src)])
    assert res.exit_code == 0, res.output
    out["stdout"] = next(ln for ln in res.output.splitlines() if "Floor load" in ln)
    res = runner.invoke(
        app, ["checklist", "--plan", str(src), "--md", str(md), "--html", str(page)]
    )
    assert res.exit_code == 0, res.output
    out["md"] = next(ln for ln in md.read_text().splitlines() if "Floor load" in ln)
    li = re.search(r"data-key='site.floor'>(.*?)</li>", page.read_text(), re.S)
    assert li is not None
    out["html"] = html.unescape(li.group(1))
    res = runner.invoke(app, ["checklist", "--plan", str(src), "--json"])
    assert res.exit_code == 0, res.output
    items = [i for s in json.loads(res.stdout)["sections"] for i in s["items"]]
    out["json"] = next(i["text"] for i in items if i["key"] == "site.floor")
    return out


def test_floor_load_in_kg_and_kg_per_m2_against_the_tia_942_rating(
    plan: dict[str, Any], tmp_path: Path
) -> None:
    f = _facility(plan)
    assert f["servers_per_rack"] == 1 and f["floor_load_kg_m2"] == pytest.approx(LOAD_KG_M2)
    for where, line in _floor_lines(plan, tmp_path).items():
        assert f"{RACK_KG:,.1f} kg per full rack (1 server)" in line, (where, line)
        assert f"{LOAD_KG_M2:,.0f} kg/m^2 over 0.72 m^2" in line, (where, line)
        assert f"within the floor rating {TIA_KG_M2:,.0f} kg/m^2 (ANSI/TIA-942" in line, where
        assert not re.search(r"\d\.\d{3,}", line), (where, line)  # no raw float


def test_floor_load_above_the_specs_rating_and_not_known(
    plan: dict[str, Any], tmp_path: Path
) -> None:
    strict = copy.deepcopy(plan)
    _facility(strict)["floor_rating_kg_m2"] = 300.0
    for where, line in _floor_lines(strict, tmp_path).items():
        assert f"{LOAD_KG_M2:,.0f} kg/m^2" in line and "EXCEEDS the floor rating 300" in line
        assert "constraints.floor_rating_kg_m2" in line, (where, line)
    unknown = copy.deepcopy(plan)
    f = _facility(unknown)
    f.update(server_weight_kg=None, rack_weight_kg=None, floor_load_kg_m2=None)
    f["weight_note"] = "rack weight and floor loading not known: X has no catalog weight"
    for where, line in _floor_lines(unknown, tmp_path).items():
        assert "rack weight and floor loading not known" in line, (where, line)
        assert "None" not in line and " 0 kg" not in line, (where, line)
        assert f"floor rating {TIA_KG_M2:,.0f} kg/m^2" in line, (where, line)
