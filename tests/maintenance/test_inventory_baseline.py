"""`gpufleet inventory --baseline` as a user runs it: a simulated fleet with mixed drivers
(the nodes out of baseline and the field that differs, exit code 1), a real controller's fleet
(versions as the agents reported them; a GPU that reported no driver is unknown, never a
match), and the errors for a bad baseline or --controller without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.testing.testbed import Controller
from tests.maintenance.conftest import push_inventory

runner = CliRunner()
OLD, NEW = "535.104.05", "550.90.07"
FLEET = f"""\
nodes:
  - {{name: a, model: h100-sxm, gpus: 2, count: 2, rack: r01, driver_version: "{OLD}"}}
  - {{name: c, model: h100-sxm, gpus: 2, count: 1, rack: r02, driver_version: "{NEW}"}}
"""


def _files(tmp_path: Path) -> tuple[Path, Path]:
    fleet, base = tmp_path / "fleet.yaml", tmp_path / "baseline.yaml"
    fleet.write_text(FLEET, encoding="utf-8")
    base.write_text(f'models:\n  h100-sxm:\n    driver: "{NEW}"\n', encoding="utf-8")
    return fleet, base


def test_sim_fleet_lists_the_old_nodes_with_the_field(tmp_path: Path) -> None:
    fleet, base = _files(tmp_path)
    r = runner.invoke(app, ["inventory", "--baseline", str(base), "--sim", str(fleet), "--json"])
    assert r.exit_code == 1, r.output  # some node is out of baseline
    doc = json.loads(r.output)
    assert doc["nodes_total"] == 3 and doc["at_baseline"] == 1
    out = {n["node"]: n for n in doc["out_of_baseline"]}
    assert len(out) == 2 and all(name.startswith("a") for name in out)
    for n in out.values():
        assert [(d["gpu"], d["field"], d["found"], d["target"]) for d in n["deviations"]] == [
            (0, "driver", OLD, NEW),
            (1, "driver", OLD, NEW),
        ]
    r = runner.invoke(app, ["inventory", "--baseline", str(base), "--sim", str(fleet)])
    assert "2 of 3 node(s) out of baseline" in r.output and OLD in r.output


def test_all_at_baseline_exits_zero(tmp_path: Path) -> None:
    _fleet, base = _files(tmp_path)
    only_new = tmp_path / "new.yaml"
    only_new.write_text(FLEET.splitlines()[0] + "\n" + FLEET.splitlines()[2] + "\n")
    r = runner.invoke(app, ["inventory", "--baseline", str(base), "--sim", str(only_new)])
    assert r.exit_code == 0, r.output
    assert "0 of 1 node(s) out of baseline" in r.output


@pytest.mark.process
def test_controller_fleet_unknown_never_matches(tmp_path: Path, ctl: Controller) -> None:
    _fleet, base = _files(tmp_path)
    push_inventory(ctl, "n-old", {"driver_version": OLD})
    push_inventory(ctl, "n-new", {"driver_version": NEW})
    push_inventory(ctl, "n-unknown", {})  # NVML gave no driver version
    tok = tmp_path / "viewer.token"
    tok.write_text(ctl.token("viewer"), encoding="utf-8")
    args = ["inventory", "--baseline", str(base), "--controller", ctl.url]
    r = runner.invoke(app, [*args, "--token-file", str(tok), "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.output)
    assert doc["nodes_total"] == 3 and doc["at_baseline"] == 1
    out = {n["node"]: n for n in doc["out_of_baseline"]}
    assert set(out) == {"n-old", "n-unknown"}
    assert out["n-old"]["deviations"][0]["status"] == "differs"
    assert out["n-old"]["verified"] is True
    unknown = out["n-unknown"]["deviations"][0]
    assert (unknown["found"], unknown["status"]) == (None, "unknown")
    assert out["n-unknown"]["verified"] is False


def test_bad_input_is_named(tmp_path: Path) -> None:
    fleet, _base = _files(tmp_path)
    bad = tmp_path / "b.yaml"
    bad.write_text("models:\n  h100-sx:\n    driver: x\n", encoding="utf-8")
    r = runner.invoke(app, ["inventory", "--baseline", str(bad), "--sim", str(fleet)])
    assert r.exit_code != 0 and "b.yaml" in str(r.exception) and "h100-sx" in str(r.exception)
    r = runner.invoke(app, ["inventory", "--controller", "http://127.0.0.1:9"])
    assert r.exit_code != 0 and "--baseline" in str(r.exception)
