"""`validate` runs `gpufleet health`'s rules at every level (issue 14 item 1): a GPU with a
volatile double-bit ECC error and XID 48 fails `health` and therefore `validate --level 1..3`,
through the real CLI on a simulated fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app

runner = CliRunner()

FLEET = """\
seed: 5
nodes:
  - {name: gpu-a-01, model: h100-sxm, gpus: 2}
faults:
  - {node: gpu-a-01, gpu: 1, kind: ecc_dbe, at_s: 0}
  - {node: gpu-a-01, gpu: 1, kind: xid, xid: 48, at_s: 0}
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gate") / "fleet.yaml"
    path.write_text(FLEET)
    return str(path)


def test_health_fails_the_gpu(fleet: str) -> None:
    result = runner.invoke(app, ["health", "--sim", fleet, "--json"])
    doc = json.loads(result.stdout)
    codes = {f["code"] for f in doc["nodes"][0]["findings"] if f["gpu_index"] == 1}
    assert doc["verdict"] == "fail" and {"ECC_DBE_VOLATILE", "XID_48"} <= codes


@pytest.mark.parametrize("level", [1, 2, 3])
def test_every_validate_level_fails_it_on_the_health_rules(
    fleet: str, level: int, tmp_path: Path
) -> None:
    args = ["validate", "--sim", fleet, "--level", str(level), "--json"]
    if level == 3:
        args += ["--duration", "60"]
    result = runner.invoke(app, args)
    doc = json.loads(result.stdout)
    assert result.exit_code != 0 and doc["status"] == "fail"
    rules = {r["gpu"]: r for r in doc["results"] if r["test"] == "health_rules"}
    assert rules[1]["status"] == "fail"
    assert {"ECC_DBE_VOLATILE", "XID_48"} <= set(rules[1]["details"]["codes"])
    assert rules[0]["status"] == "pass"
