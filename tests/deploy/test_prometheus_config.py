"""`gpufleet config prometheus` discovery options: the HTTP SD job's shape (Prometheus'
http_sd_config fields), and clear errors for options that do not go together. The real
Prometheus reading these configs is in test_prometheus_reads.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import UsageError

runner = CliRunner()


def test_http_sd_job() -> None:
    args = ["config", "prometheus", "--controller", "https://cp:8443", "--agent-port", "9500"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    job = doc["config"]["scrape_configs"][0]
    assert "static_configs" not in job
    (sd,) = job["http_sd_configs"]
    assert sd["url"] == "https://cp:8443/api/v1/prometheus/sd?port=9500"
    # the token stays in a file Prometheus reads, never in its config
    assert sd["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/prometheus/gpufleet-token",
    }
    assert sd["refresh_interval"] == "60s"
    assert {r["target_label"] for r in job["relabel_configs"]} == {"rack", "tenant"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--controller", "http://cp:8080", "--target", "n1:9400"], "not both"),
        (["--controller", "http://cp:8080", "--sd", "file"], "--sd-file"),
        (["--controller", "http://cp:8080", "--sd", "dns"], "--sd 'dns'"),
        (["--controller", "cp:8080"], "--controller"),
        (["--controller", "http://cp:8080", "--sd-refresh", "0"], "--sd-refresh"),
    ],
)
def test_bad_combinations(args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["config", "prometheus", *args])
    assert isinstance(res.exception, UsageError), res.output
    assert needle in str(res.exception)
