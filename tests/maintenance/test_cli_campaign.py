"""`gpufleet maintenance start|status|pause|resume|abort` against a real controller on
loopback: operators start and steer a campaign, viewers read its status and are refused
writes, the JSON answer lists the nodes out of baseline, a bad baseline names its file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.client import Client
from gpufleet.testing.testbed import Controller
from tests.maintenance.conftest import register

runner = CliRunner()
OLD, NEW = "535.104.05", "550.90.07"


@pytest.mark.process
def test_start_status_pause_resume_abort(tmp_path: Path, ctl: Controller) -> None:
    register(ctl, "a1", OLD)
    register(ctl, "a2", OLD)
    register(ctl, "b1", NEW)  # already at the baseline: not selected
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(f'models:\n  h100-sxm:\n    driver: "{NEW}"\n', encoding="utf-8")
    op, viewer = tmp_path / "op.token", tmp_path / "viewer.token"
    op.write_text(ctl.token("operator"), encoding="utf-8")
    viewer.write_text(ctl.token("viewer"), encoding="utf-8")
    common = ["--controller", ctl.url]
    start = [
        "maintenance", "start", "--baseline", str(baseline),
        "--update-command", "true", "--batch", "1", "--floor", "0%", *common,
    ]  # fmt: skip
    r = runner.invoke(app, [*start, "--token-file", str(viewer), "--json"])
    assert r.exit_code != 0 and "403" in str(r.exception), r.output
    r = runner.invoke(app, [*start, "--token-file", str(op), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert sorted(n["node"] for n in doc["nodes"]) == ["a1", "a2"]
    assert doc["state"] == "running"
    for action, state in (("pause", "paused"), ("resume", "running"), ("abort", "aborted")):
        r = runner.invoke(app, ["maintenance", action, *common, "--token-file", str(op), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["state"] == state
    r = runner.invoke(
        app, ["maintenance", "status", *common, "--token-file", str(viewer), "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["id"] == doc["id"]
    r = runner.invoke(app, ["maintenance", "status", *common, "--token-file", str(viewer)])
    assert r.exit_code == 0 and f"campaign {doc['id']}" in r.output
    r = runner.invoke(app, ["maintenance", "pause", *common, "--token-file", str(viewer), "--json"])
    assert r.exit_code != 0 and "403" in str(r.exception)
    # a tenant's viewer reads only the nodes it sees: a1 belongs to another tenant
    with Client(ctl.url, ctl.admin) as admin:
        admin.set_node("a1", tenant="other")
    t_viewer = tmp_path / "t.token"
    t_viewer.write_text(ctl.token("viewer", tenant="mine"), encoding="utf-8")
    r = runner.invoke(
        app, ["maintenance", "status", *common, "--token-file", str(t_viewer), "--json"]
    )
    assert r.exit_code == 0, r.output
    seen = json.loads(r.output)
    assert [n["node"] for n in seen["nodes"]] == ["a2"]  # shared; a1 is not its to read
    assert seen["capacity"] is None and sum(seen["by_step"].values()) == 1
    r = runner.invoke(app, ["maintenance", "status", *common, "--token-file", str(t_viewer)])
    # as words: the token's random name (role and 6 hex digits, e.g. operator-64a179) may
    # hold the letters "a1" (it failed the old substring check once)
    assert r.exit_code == 0, r.output
    assert not re.search(r"\ba1\b", r.output) and re.search(r"\ba2\b", r.output), r.output


def test_bad_baseline_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "b.yaml"
    bad.write_text("models:\n  h100-sx:\n    driver: x\n", encoding="utf-8")
    tok = tmp_path / "t"
    tok.write_text("gf_x", encoding="utf-8")
    r = runner.invoke(
        app,
        [
            "maintenance", "start", "--baseline", str(bad), "--update-command", "true",
            "--controller", "http://127.0.0.1:9", "--token-file", str(tok),
        ],
    )  # fmt: skip
    assert r.exit_code != 0
    assert "b.yaml" in str(r.exception) and "h100-sx" in str(r.exception)
