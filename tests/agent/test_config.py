"""`gpufleet config agent-systemd` and `gpufleet config prometheus` (checked by promtool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.agent.conftest import need_binary

runner = CliRunner()


def test_systemd_unit() -> None:
    res = runner.invoke(app, ["config", "agent-systemd", "--controller", "https://cp.example:8443"])
    assert res.exit_code == 0, res.output
    unit = res.output
    sections = [ln for ln in unit.splitlines() if ln.startswith("[")]
    assert sections == ["[Unit]", "[Service]", "[Install]"]
    exec_line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    assert exec_line.split("=", 1)[1].split()[:2] == ["/usr/local/bin/gpufleet", "agent"]
    assert "--controller https://cp.example:8443" in exec_line
    assert "--token" not in unit  # the token comes from the EnvironmentFile, not argv
    assert "EnvironmentFile=-/etc/gpufleet/agent.env" in unit
    assert "Restart=always" in unit and "WantedBy=multi-user.target" in unit
    js = runner.invoke(app, ["config", "agent-systemd", "--json"])
    assert json.loads(js.output)["name"] == "gpufleet-agent.service"


def test_prometheus_config_and_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    rules = tmp_path / "gpufleet-rules.yml"
    res = runner.invoke(
        app,
        [
            "config",
            "prometheus",
            "--target",
            "10.0.0.1:9400",
            "--target",
            "10.0.0.2:9400",
            "--rules-out",
            str(rules),
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(res.output, encoding="utf-8")
    assert "10.0.0.2:9400" in res.output
    out = subprocess.run(
        [promtool, "check", "config", str(cfg)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout
