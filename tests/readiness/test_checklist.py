"""`gpufleet checklist`: open without evidence, ticked from a real inventory, validation run and
doctor report, failed where the evidence disproves an item, partial coverage left open."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.checklist import build_checklist, to_html, to_markdown
from gpufleet.cli.app import app
from gpufleet.errors import ConfigError
from tests.cli import cli_json
from tests.readiness.test_readiness_checks import HEALTHY, tree

runner = CliRunner()
PILOT = Path(__file__).parents[2] / "src" / "gpufleet" / "plan" / "examples" / "pilot-8gpu.yaml"


@pytest.fixture(scope="module")
def plan() -> dict[str, Any]:
    return cli_json("plan", str(PILOT))


@pytest.fixture(scope="module")
def inventory() -> dict[str, Any]:
    return cli_json("inventory", "--sim", "1x8xh100-sxm")


@pytest.fixture(scope="module")
def validation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("v") / "result.json"
    result = runner.invoke(
        app, ["validate", "--sim", "1x8xh100-sxm", "--level", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert isinstance(doc, dict)
    return doc


def states(c: Any) -> dict[str, str]:
    return {i.key: i.state for s in c.sections for i in s.items}


def chosen(plan: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in plan["candidates"] if c["candidate"] == plan["chosen"])


def test_without_evidence_everything_is_open_with_the_plans_numbers(plan: dict[str, Any]) -> None:
    c = build_checklist(plan)
    assert set(states(c).values()) == {"open"}
    assert [s.key for s in c.sections] == [
        "site",
        "racking",
        "cabling",
        "baseline",
        "software",
        "readiness",
        "validation",
    ]
    f = chosen(plan)["facility"]
    power = next(i.text for i in c.sections[0].items if i.key == "site.power")
    assert f"{f['racks']} racks" in power and f"{f['rack_load_kw']:,.1f} kW" in power
    cables = [i for i in c.sections[2].items if i.key.startswith("cabling.cable_")]
    assert len(cables) == len(chosen(plan)["fabric"]["cables"])
    # the planner's UPS and generators, not "the plan gives no UPS figure"
    plant = chosen(plan)["plant"]
    ups = next(i.text for i in c.sections[0].items if i.key == "site.ups")
    assert f"{plant['ups_kva']:,.0f} kVA" in ups and "no UPS figure" not in ups
    md = to_markdown(c)
    assert md.count("- [ ] ") == len(states(c)) and "- [x]" not in md
    assert "## Sign-off" in md and "Acceptance (owner)" in md


def test_evidence_ticks_what_it_proves(
    plan: dict[str, Any], inventory: dict[str, Any], validation: dict[str, Any]
) -> None:
    doctor = cli_json("doctor", "--root", str(HEALTHY), "--cuda", "12.4", "--ib-rate", "400")
    c = build_checklist(plan, inventory, [("v1.json", validation)], [("d.json", doctor)])
    got = states(c)
    driver = inventory["nodes"][0]["driver_version"]
    items = {i.key: i for s in c.sections for i in s.items}
    assert got["baseline.inventory"] == "done"
    assert got["baseline.driver"] == "done" and driver in (items["baseline.driver"].evidence or "")
    for phase in ("driver", "cuda", "containers", "gpudirect", "network", "host"):
        assert got[f"software.{phase}"] == "done", items[f"software.{phase}"].evidence
    assert got["readiness.hgx-h100"] == "done"
    assert got["readiness.sim-00"] == "open"  # in the inventory, no doctor report for it
    assert got["validation.level1"] == "done"
    assert "v1.json: 1 of 1 node(s)" in (items["validation.level1"].evidence or "")
    assert got["validation.level2"] == got["validation.level3"] == "open"
    assert got["site.power"] == "open"  # no file proves a circuit
    page = to_html(c)
    done = sum(v in ("done", "warn") for v in got.values())
    assert page.count(" checked ") == done


def test_evidence_that_disproves_an_item_fails_it(
    tmp_path: Path, plan: dict[str, Any], inventory: dict[str, Any], validation: dict[str, Any]
) -> None:
    result = runner.invoke(app, ["doctor", "--json", "--root", str(tree(tmp_path, "ib-port-down"))])
    assert result.exit_code == 2
    doctor = json.loads(result.stdout)
    failing = json.loads(json.dumps(validation))
    failing["results"][1]["status"] = "fail"
    bad_inv = json.loads(json.dumps(inventory))
    bad_inv["nodes"][0]["gpus"] = bad_inv["nodes"][0]["gpus"][:7]
    c = build_checklist(plan, bad_inv, [("v.json", failing)], [("d.json", doctor)])
    got = states(c)
    assert got["software.network"] == "failed"
    assert got["readiness.node"] == "failed"
    assert got["validation.level1"] == "failed"
    assert got["baseline.inventory"] == "failed"
    items = {i.key: i for s in c.sections for i in s.items}
    assert "mlx5_3" in (items["readiness.node"].evidence or "")
    assert "- [ ] FAILED" in to_markdown(c)


def test_evidence_for_part_of_the_fleet_leaves_items_open(
    plan: dict[str, Any], validation: dict[str, Any]
) -> None:
    bigger = json.loads(json.dumps(plan))
    chosen(bigger)["servers"] = 4
    c = build_checklist(bigger, None, [("v.json", validation)])
    item = next(i for s in c.sections for i in s.items if i.key == "validation.level1")
    assert item.state == "open" and "1 of 4 node(s)" in (item.evidence or "")


def test_partial_level_is_not_done(plan: dict[str, Any], validation: dict[str, Any]) -> None:
    partial = json.loads(json.dumps(validation))
    partial["results"] = [r for r in partial["results"] if r["test"] == "software"]
    c = build_checklist(plan, None, [("v.json", partial)])
    item = next(i for s in c.sections for i in s.items if i.key == "validation.level1")
    assert item.state == "open" and "missing: " in (item.evidence or "")


def test_cli_writes_html_and_markdown(tmp_path: Path, plan: dict[str, Any]) -> None:
    hostile = json.loads(json.dumps(plan))
    hostile["name"] = "<script>alert(1)</script>"
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(hostile))
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["checklist", "--plan", str(p), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert len(re.findall(r"<input type=checkbox", page)) == len(states(build_checklist(hostile)))
    md = tmp_path / "c.md"
    assert runner.invoke(app, ["checklist", "--plan", str(p), "--md", str(md)]).exit_code == 0
    assert md.read_text().startswith("# Deployment checklist: <script>")


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    p.write_text('{"chosen": "x", "candidates": []}')
    with pytest.raises(ConfigError, match="no candidate named by 'chosen'"):
        build_checklist(json.loads(p.read_text()), where=f"--plan {p}")
    p.write_text("[1, 2")
    result = runner.invoke(app, ["checklist", "--plan", str(p)])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError) and "line 1" in result.exception.message


@pytest.mark.parametrize("junk", [None, 7, "x", [1, [2]], {"a": [1]}])
def test_hand_edited_files_of_the_wrong_shape_never_crash(
    plan: dict[str, Any], inventory: dict[str, Any], validation: dict[str, Any], junk: Any
) -> None:
    """Every field the checklist reads, replaced by a value of the wrong type: items stay open
    or show "?", no exception."""
    docs = [json.loads(json.dumps(d)) for d in (plan, inventory, validation)]
    p, inv, val = docs
    cand = chosen(p)
    for key in ("facility", "server", "fabric", "servers"):
        cand[key] = junk
    inv["nodes"] = [junk, {"name": junk, "gpus": junk}]
    val["results"] = [junk, {"test": junk, "node": junk, "metrics": [junk], "status": junk}]
    doctor = {"readiness": {"node": junk, "checks": [junk, {"phase": junk, "status": junk}]}}
    c = build_checklist(p, inv, [("v.json", val)], [("d.json", doctor)])
    assert to_markdown(c) and to_html(c)


def test_a_plan_without_a_list_of_candidates_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no candidate named by 'chosen'"):
        build_checklist({"chosen": "a", "candidates": 3})
