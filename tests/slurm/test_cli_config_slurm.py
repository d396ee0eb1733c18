"""`gpufleet config slurm` through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.app import app


def test_config_slurm_from_plan_writes_files(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "chosen": "h200-sxm",
                "candidates": [
                    {
                        "candidate": "h200-sxm",
                        "servers": 3,
                        "server": {"gpus": 8, "gpu_key": "h200-sxm"},
                        "fabric": {"compute": {"levels": 1, "radix": 64}},
                    }
                ],
            }
        )
    )
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "config",
            "slurm",
            "--plan",
            str(plan),
            "--out",
            str(out),
            "--health-check",
            "/opt/gpufleet/hc.sh",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert sorted(Path(p).name for p in doc["written"]) == [
        "gres.conf",
        "healthcheck.sh",
        "slurm.conf",
        "topology.conf",
    ]
    conf = (out / "slurm.conf").read_text().splitlines()
    assert "NodeName=gpu[001-003] Gres=gpu:h200:8 State=UNKNOWN" in conf
    assert "HealthCheckProgram=/opt/gpufleet/hc.sh" in conf
    assert "export SLURM_CONF=/etc/slurm/slurm.conf" in (out / "healthcheck.sh").read_text()


def test_config_slurm_inventory_sim_and_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["config", "slurm", "--inventory", "--sim", "2x4xh100", "--json"])
    assert res.exit_code == 0, res.output
    files = json.loads(res.output)["files"]
    assert (
        "NodeName=sim-[00-01] Name=gpu Type=h100 Count=4 File=/dev/nvidia[0-3]"
        in files["gres.conf"].splitlines()
    )
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    res = CliRunner().invoke(app, ["config", "slurm", "--plan", str(bad)])
    assert res.exit_code != 0 and "not JSON" in str(res.exception or res.output)
