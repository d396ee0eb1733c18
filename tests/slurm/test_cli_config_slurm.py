"""`gpufleet config slurm` through the real CLI app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import UsageError


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


def _inv(path: Path, *names: str, driver: str = "550.54.15") -> Path:
    host = {"cpus": 8, "boards": 1, "sockets_per_board": 1, "cores_per_socket": 4}
    host |= {"threads_per_core": 2, "memory_mb": 64000}
    gpu = {"model": "h100-sxm", "driver_version": driver}
    nodes = [{"name": n, "host": host, "gpus": [gpu, gpu]} for n in names]
    path.write_text(json.dumps({"nodes": nodes}))
    return path


def test_inventory_files_and_health_check_wrapper(tmp_path: Path) -> None:
    a = _inv(tmp_path / "a.json", "n1")
    b = _inv(tmp_path / "b.json", "n2", driver="570.86.10")
    args = ["config", "slurm", "--inventory-file", str(a), "--inventory-file", str(b)]
    args += ["--health-check", "/etc/slurm/hc.sh", "--max-drained", "3", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    files = json.loads(res.output)["files"]
    lines = [ln for ln in files["slurm.conf"].splitlines() if ln.startswith("NodeName=")]
    topo = "CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=64000"
    assert lines == [
        f"NodeName=n1 {topo} Gres=gpu:h100:2 Features=h100,driver_550.54.15 State=UNKNOWN",
        f"NodeName=n2 {topo} Gres=gpu:h100:2 Features=h100,driver_570.86.10 State=UNKNOWN",
    ]
    hc = files["healthcheck.sh"].splitlines()
    assert hc[-1] == (
        "exec gpufleet health --exit-code --slurm-drain --duration 1 --max-drained 3 "
        ">/dev/null 2>>/var/log/gpufleet/health-check.log"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--controller", "https://ctl:8443"], "--token-file"),
        (["--controller", "ftp://ctl", "--token-file", "/t"], "expected a URL"),
        (["--max-drained", "lots"], "--max-drained 'lots'"),
        (["--controller", "https://c:1", "--token-file", "/t", "--max-drained", "2"], "or --max"),
    ],
)
def test_health_check_option_errors(tmp_path: Path, extra: list[str], message: str) -> None:
    a = _inv(tmp_path / "a.json", "n1")
    res = CliRunner().invoke(app, ["config", "slurm", "--inventory-file", str(a), *extra])
    assert isinstance(res.exception, UsageError), res.output  # the CLI's exit 2
    assert message in str(res.exception)


def test_inventory_files_naming_a_node_twice_is_an_error(tmp_path: Path) -> None:
    a, b = _inv(tmp_path / "a.json", "n1"), _inv(tmp_path / "b.json", "n1")
    res = CliRunner().invoke(
        app, ["config", "slurm", "--inventory-file", str(a), "--inventory-file", str(b)]
    )
    assert res.exit_code != 0
    assert f"node 'n1' is also in {a}" in str(res.exception or "") + res.output
