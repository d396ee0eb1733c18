"""`gpufleet plan` end to end: summary, --json, --bom, --html, --example, errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "training-1024.yaml"
runner = CliRunner()


def test_json_has_the_whole_plan() -> None:
    r = runner.invoke(app, ["plan", str(SPEC), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    chosen = next(c for c in doc["candidates"] if c["candidate"] == doc["chosen"])
    assert chosen["gpus"] == 1024 and chosen["servers"] == 128
    for part in ("facility", "fabric", "storage", "cost", "workloads"):
        assert chosen[part]
    assert chosen["fabric"]["compute"]["leaves"] == 32  # 128 nodes x 8 rails, 4 SU
    assert doc["assumptions"]


def test_summary_compare_bom_html(tmp_path: Path) -> None:
    bom, html = tmp_path / "bom.csv", tmp_path / "r.html"
    r = runner.invoke(app, ["plan", str(SPEC), "--compare", "--bom", str(bom), "--html", str(html)])
    assert r.exit_code == 0, r.output
    assert "Candidates" in r.stdout and "h100-sxm" in r.stdout
    rows = list(csv.DictReader(io.StringIO(bom.read_text())))
    servers = [x for x in rows if x["category"] == "server"]
    assert servers and servers[0]["quantity"] == "128"
    leaf = next(x for x in rows if x["item"] == "compute leaf switch")
    assert leaf["quantity"] == "32"
    node_leaf = sum(int(x["quantity"]) for x in rows if x["item"].startswith("compute node-leaf"))
    assert node_leaf == 1024
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert "Cost per GPU-hour" in page and "leaf-spine" in page


def test_example_prints_a_valid_spec() -> None:
    from gpufleet.plan.spec import load_spec

    r = runner.invoke(app, ["plan", "--example"])
    assert r.exit_code == 0
    assert r.stdout.lstrip().startswith("#")
    assert load_spec(r.stdout).candidates


def test_bad_spec_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("candidates: [h10-sxm]\nworkloads: [{kind: gpus, gpus: 8}]\n")
    r = runner.invoke(app, ["plan", str(bad)])
    assert r.exit_code != 0
    assert "h100-sxm" in str(r.exception)


def test_unknown_candidate_error_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("candidates: [h10-sxm]\nworkloads: [{kind: gpus, gpus: 8}]\n")
    r = runner.invoke(app, ["plan", str(bad)])
    assert str(r.exception).startswith(f"{bad}: candidates[0]: unknown GPU model or system")


def test_error_path_keeps_a_field_named_gpus() -> None:
    """`gpus` is both a workload kind tag and a field; the field used to vanish from the path."""
    from gpufleet.errors import ConfigError
    from gpufleet.plan.spec import load_spec

    training = SPEC.read_text().replace("gpus: 1024 ", "gpus: -8 ")
    gpus_kind = "candidates: [h100]\nworkloads: [{kind: gpus, gpus: -8}]\n"
    for text in (training, gpus_kind):
        assert "gpus: -8" in text
        try:
            load_spec(text, "s.yaml")
        except ConfigError as exc:
            assert "workloads[0].gpus: -8" in str(exc), exc
        else:
            raise AssertionError("gpus: -8 was accepted")
