"""`gpufleet config controller-systemd`: the control plane's unit is confined like the agent's
(and more: it needs no devices and no capabilities), takes its secrets from an
EnvironmentFile, never from its command line, and passes `systemd-analyze verify`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pytest import MonkeyPatch
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.cli.config_agent import AGENT_ONLY
from gpufleet.cli.config_controller import ENV_KEYS
from tests.agent.conftest import need_binary

runner = CliRunner()


def _service(unit: str) -> dict[str, str]:
    section = unit.split("[Service]", 1)[1].split("[Install]", 1)[0]
    return dict(ln.split("=", 1) for ln in section.splitlines() if "=" in ln)


def _unit(*args: str) -> str:
    res = runner.invoke(app, ["config", "controller-systemd", "--exec", "/bin/true", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_hardened_like_the_agent_and_secrets_from_the_environment_file() -> None:
    svc = _service(_unit("--user", "root", "--policy", "/etc/gpufleet/policy.yaml"))
    # every sandboxing setting of the agent's unit that is not a resource cap
    for line in AGENT_ONLY:
        key, value = line.split("=", 1)
        if key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"):
            assert svc[key] == value, key
    assert svc["PrivateDevices"] == "true"  # no GPU needed, unlike the agent
    assert svc["CapabilityBoundingSet"] == ""  # no capability at all on port 8080
    assert svc["UMask"] == "0077" and svc["StateDirectoryMode"] == "0700"
    assert svc["ReadWritePaths"] == "/var/lib/gpufleet/controller"
    assert svc["EnvironmentFile"] == "-/etc/gpufleet/controller.env"
    # the database URL and Prometheus URL are read from the environment (the file), so the
    # command line holds neither: no --db-url, no --prometheus-url, no token
    assert set(ENV_KEYS) == {"GPUFLEET_DB_URL", "GPUFLEET_PROMETHEUS_URL"}
    for forbidden in ("--db-url", "--prometheus-url", "--token", "postgresql"):
        assert forbidden not in svc["ExecStart"]
    assert svc["ExecStart"].endswith("--policy /etc/gpufleet/policy.yaml")


def test_environment_variables_reach_the_controller_options(monkeypatch: MonkeyPatch) -> None:
    """The names the unit documents are the ones `gpufleet controller` reads."""
    from gpufleet.cli import controller_common as controller

    res = runner.invoke(app, ["controller", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "GPUFLEET_PROMETHEUS_URL" in res.output
    monkeypatch.setenv("GPUFLEET_DB_URL", "postgresql://u:pw@db/gf")
    assert controller._db_url(None) == "postgresql://u:pw@db/gf"


def test_low_port_gets_only_the_bind_capability() -> None:
    svc = _service(_unit("--user", "root", "--port", "443"))
    assert svc["AmbientCapabilities"] == "CAP_NET_BIND_SERVICE"
    assert svc["CapabilityBoundingSet"] == "CAP_NET_BIND_SERVICE"


def test_bad_options_are_refused() -> None:
    res = runner.invoke(app, ["config", "controller-systemd", "--tls-cert", "/c.pem"])
    assert res.exit_code != 0 and "--tls-key" in str(res.exception)


@pytest.mark.process
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = need_binary("systemd-analyze")
    for name, args in (("plain", ()), ("tls", ("--tls-cert", "/c.pem", "--tls-key", "/k.pem"))):
        path = tmp_path / name / "gpufleet-controller.service"
        path.parent.mkdir()
        path.write_text(_unit("--user", "root", *args))
        out = subprocess.run(
            [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and not out.stderr.strip(), (name, out.stderr)
