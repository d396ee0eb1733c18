"""`gpufleet config agent-systemd` and `gpufleet config prometheus` (checked by promtool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
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


@pytest.mark.process
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
    assert "SUCCESS: 11 rules found" in out.stdout


def test_bad_urls_targets_and_paths_are_usage_errors(tmp_path: Path) -> None:
    """These used to be written into the unit/config as given (or, for --rules-out into a
    missing directory, end in a traceback)."""
    from gpufleet.errors import GpufleetError

    cases = [
        (["agent-systemd", "--controller", "cp:8443"], "expected a URL"),
        (["agent-systemd", "--controller", "http://cp:99999"], "expected a URL"),
        (["agent-systemd", "--listen", "9400"], "expected HOST:PORT"),
        (["prometheus", "--target", "node1"], "expected HOST:PORT"),
        (["prometheus", "--target", "node1:99999"], "expected HOST:PORT"),
        (["prometheus", "--rules-out", str(tmp_path / "no" / "r.yml")], "cannot write"),
    ]
    for args, needle in cases:
        res = runner.invoke(app, ["config", *args])
        assert isinstance(res.exception, GpufleetError), (args, res.output)
        assert res.exception.exit_code == 2 and needle in str(res.exception), args
    ok = runner.invoke(app, ["config", "prometheus", "--target", "[::1]:9400"])
    assert ok.exit_code == 0, ok.output
    ok = runner.invoke(app, ["config", "agent-systemd", "--listen", ":9400"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.process
def test_agent_start_line_is_one_line_with_whole_urls(tmp_path: Path) -> None:
    """The start line goes to journals and scripts: never wrapped at 80 columns (it used to
    break before the controller URL when stdout was not a terminal)."""
    from tests.control.conftest import free_port

    controller = "http://127.0.0.1:1/a-long-path-to-push-the-line-past-eighty-columns"
    res = runner.invoke(
        app,
        [
            "agent",
            "--sim",
            "1x2xh100",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--controller",
            controller,
            "--token",
            "gf_x",
            "--state-dir",
            str(tmp_path),
            "--duration",
            "0.5",
        ],
    )
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("gpufleet agent on ") and first.endswith(f"pushing to {controller}")


def _service(unit: str) -> dict[str, str]:
    section = unit.split("[Service]", 1)[1].split("[Install]", 1)[0]
    return dict(ln.split("=", 1) for ln in section.splitlines() if "=" in ln)


@pytest.mark.process
def test_unit_for_jobs_holds_nothing_a_job_cannot_live_with(tmp_path: Path) -> None:
    """Jobs started by ``--run-jobs`` are the agent's children and inherit its unit: the job
    unit has no memory cap, no read-only file system or hidden home, does not stop the agent
    when one job is killed for memory, and passes `systemd-analyze verify` without a warning;
    the agent-only unit keeps its confinement."""
    common = ["config", "agent-systemd", "--exec", "/bin/true", "--user", "root"]
    plain = runner.invoke(app, common)
    jobs = runner.invoke(app, [*common, "--run-jobs", "--ca", "/etc/gpufleet/ca.pem"])
    assert plain.exit_code == 0 and jobs.exit_code == 0, (plain.output, jobs.output)
    alone, with_jobs = _service(plain.output), _service(jobs.output)
    assert alone["MemoryMax"] == "512M" and alone["ProtectSystem"] == "strict"
    assert "--run-jobs" not in alone["ExecStart"]
    assert with_jobs["ExecStart"].endswith("--ca /etc/gpufleet/ca.pem --run-jobs")
    for confining in ("MemoryMax", "ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges"):
        assert confining not in with_jobs, confining
    assert with_jobs["OOMPolicy"] == "continue"
    assert with_jobs["LimitMEMLOCK"] == "infinity"
    assert with_jobs["Delegate"] == "yes"
    assert alone["UMask"] == with_jobs["UMask"] == "0077"  # the state directory stays private
    analyze = need_binary("systemd-analyze")
    for name, unit in (("plain", plain.output), ("jobs", jobs.output)):
        path = tmp_path / name / "gpufleet-agent.service"
        path.parent.mkdir()
        path.write_text(unit)
        out = subprocess.run(
            [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and not out.stderr.strip(), (name, out.stderr)
