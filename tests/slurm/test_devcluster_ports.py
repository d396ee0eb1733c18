"""scripts/slurm-dev-cluster.sh takes its ports and state directory as options, so two dev
clusters run side by side: two option sets render two configurations that share no port and no
path (``up --print-config`` renders without writing or starting anything)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.schedulers.slurm.devcluster import cluster_ports, main

SCRIPT = Path(__file__).parents[2] / "scripts" / "slurm-dev-cluster.sh"
# slurm.conf settings naming a port, a directory or a file a daemon owns (slurm.conf(5))
OWNED = (
    "SlurmctldPort",
    "StateSaveLocation",
    "SlurmdSpoolDir",
    "SlurmctldPidFile",
    "SlurmdPidFile",
    "SlurmctldLogFile",
    "SlurmdLogFile",
    "AuthInfo",
)


def _render(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, str]:
    assert main(["up", "--print-config", *args]) == 0
    out = capsys.readouterr().out
    conf = out.split("# ---- gres.conf")[0]
    settings = dict(
        ln.split("=", 1) for ln in conf.splitlines() if "=" in ln and not ln.startswith("Node")
    )
    settings["nodes"] = "\n".join(ln for ln in conf.splitlines() if ln.startswith("NodeName="))
    return settings


def test_two_option_sets_give_two_clusters_that_do_not_clash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _render(capsys, "--dir", str(a_dir), "--slurmctld-port", "16817", "--slurmd-port", "16818")
    b = _render(
        capsys, "--state-dir", str(b_dir), "--slurmctld-port", "26817", "--slurmd-port", "26818"
    )
    # 3 nodes (the default): slurmd ports are the 3 after the one given
    assert a["SlurmctldPort"] == "16817" and "Port=[16818-16820]" in a["nodes"]
    assert b["SlurmctldPort"] == "26817" and "Port=[26818-26820]" in b["nodes"]
    assert a["StateSaveLocation"] == f"{a_dir}/state"
    assert a["AuthInfo"] == f"socket={a_dir}/munge/munge.socket.2"  # each its own munged
    for key in OWNED:
        assert a[key] != b[key], key
    assert not a_dir.exists() and not b_dir.exists()  # --print-config writes nothing


def test_one_slurmd_port_per_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--dir", str(tmp_path), "--slurmctld-port", "7000", "--slurmd-port", "7001,7005,7009"]
    nodes = _render(capsys, *args)["nodes"].splitlines()
    # not consecutive: each node its own line (a shared line needs Port=[a-b], slurm.conf(5))
    assert [ln.split()[0] for ln in nodes] == ["NodeName=gpu1", "NodeName=gpu2", "NodeName=gpu3"]
    assert [ln.split()[3] for ln in nodes] == ["Port=7001", "Port=7005", "Port=7009"]


@pytest.mark.parametrize(
    ("ctld", "slurmd", "words"),
    [
        (7000, "7001,7002", "2 ports for 3 nodes"),
        (7001, "7001-7003", "ports repeat"),
        (None, "7001", "needs --slurmctld-port"),
        (70000, None, "1-65535"),
        (7000, "65534", "no room for 3"),
        (7000, "70x", "expected a port"),
    ],
)
def test_bad_ports_are_clear_errors(ctld: int | None, slurmd: str | None, words: str) -> None:
    with pytest.raises(GpufleetError, match=words):
        cluster_ports(ctld, slurmd, 3)


def test_bad_options_exit_2_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["up", "--print-config", "--slurmctld-port", "7000", "--slurmd-port", "7000"])
    assert ex.value.code == 2 and "--slurmd-port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["down", "--print-config"])
    assert "--print-config goes with up" in capsys.readouterr().err


def test_defaults_are_unchanged() -> None:
    # no options: ports picked at run time (0), slurmd after slurmctld as before
    assert cluster_ports(None, None, 3) == (0, ())


@pytest.mark.process
def test_the_script_lists_its_options_and_prints_config(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLEET_SLURM_DEV": str(tmp_path / "dev")}
    run = [str(SCRIPT), "--help"]
    helped = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert helped.returncode == 0, helped.stderr
    for option in ("--slurmctld-port", "--slurmd-port", "--state-dir", "--print-config"):
        assert option in helped.stdout
    run = [str(SCRIPT), "up", "--print-config", "--slurmctld-port", "16900"]
    shown = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "SlurmctldPort=16900" in shown.stdout and "Port=[16901-16903]" in shown.stdout
    assert f"StateSaveLocation={tmp_path / 'dev'}/state" in shown.stdout
