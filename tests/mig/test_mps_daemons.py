"""Bare-metal MPS on several GPUs of one host: one pipe directory per GPU's daemon, and a
status check that reads the control pipe and asks the control program for its servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.mig.sharing import mps_commands, parse_mps_clients


def test_each_gpu_gets_its_own_pipe_and_log_directory() -> None:
    clients = parse_mps_clients(["a:50"])
    d0, d1 = (mps_commands(i, clients) for i in (0, 1))
    assert d0["pipe_dir"] != d1["pipe_dir"] and d0["log_dir"] != d1["log_dir"]
    assert d0["clients"][0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps-0"
    assert d1["clients"][0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps-1"
    assert "echo get_server_list | nvidia-cuda-mps-control" in d1["check"]


def test_a_shared_directory_template_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--pipe-dir '/tmp/mps'.*\{gpu\}"):
        mps_commands(0, parse_mps_clients(["a:50"]), pipe_dir="/tmp/mps")


def _status(tmp_path: Path, path: str, *devices: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "mig",
            "sharing",
            "mps-status",
            "--device",
            ",".join(devices),
            "--pipe-dir",
            str(tmp_path / "mps-{gpu}"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path},
    )


@pytest.mark.process
def test_status_running_stopped_and_unknown(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a stand-in for NVIDIA's control program (not installable here): answers
    # get_server_list with two PIDs when its pipe directory is GPU 0's
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(
        "#!/bin/sh\nread cmd\n"
        '[ "$cmd" = get_server_list ] || exit 9\n'
        'case "$CUDA_MPS_PIPE_DIRECTORY" in *mps-0) echo 4242; echo 4343;; esac\n'
    )
    fake.chmod(0o755)
    (tmp_path / "mps-0").mkdir()
    os.mkfifo(tmp_path / "mps-0" / "control")
    path = f"{bin_dir}:/usr/bin:/bin"
    r = _status(tmp_path, path, "0")
    assert r.returncode == 0, r.stderr
    (st,) = json.loads(r.stdout)["devices"]
    assert (st["state"], st["servers"]) == ("running", [4242, 4343])
    r = _status(tmp_path, path, "0", "1")  # GPU 1 has no daemon
    assert r.returncode == 2
    states = [d["state"] for d in json.loads(r.stdout)["devices"]]
    assert states == ["running", "stopped"]
    r = _status(tmp_path, "/usr/bin:/bin", "0")  # pipe there, control program missing
    assert r.returncode == 3
    assert json.loads(r.stdout)["devices"][0]["state"] == "unknown"
