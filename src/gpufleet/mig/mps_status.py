"""Is the MPS control daemon of a GPU up? Reads its pipe directory and asks it for its servers.

The control daemon (``nvidia-cuda-mps-control -d``) creates a ``control`` FIFO in
``CUDA_MPS_PIPE_DIRECTORY``; ``echo get_server_list | nvidia-cuda-mps-control`` with the same
directory prints the PIDs of its MPS servers, one per line (NVIDIA MPS guide, "Appendix: Tools
and Interface Reference", docs.nvidia.com/deploy/mps/appendix-tools-and-interface-reference.html).
The command runner is injected so tests drive a stand-in control program.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
TIMEOUT_S = 5.0

Runner = Callable[[list[str], str, dict[str, str], float], tuple[int, str, str]]


def run_command(
    argv: list[str], stdin: str, env: dict[str, str], timeout_s: float
) -> tuple[int, str, str]:
    """Run ``argv`` with ``stdin`` and extra ``env``: (exit code, stdout, stderr); 127 when the
    program is missing, 124 on timeout."""
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within {timeout_s:g} s"
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class MpsStatus:
    """One GPU's MPS daemon as found: ``state`` is running, stopped or unknown."""

    device: int
    pipe_dir: str
    state: str
    servers: tuple[int, ...]
    detail: str


def mps_status(device: int, pipe_dir: str, runner: Runner = run_command) -> MpsStatus:
    """The state of GPU ``device``'s daemon whose pipes are in ``pipe_dir``."""
    control = Path(pipe_dir) / "control"
    try:
        is_fifo = stat.S_ISFIFO(control.stat().st_mode)
    except OSError:
        is_fifo = False
    if not is_fifo:
        return MpsStatus(device, pipe_dir, "stopped", (), f"no control pipe in {pipe_dir}")
    code, out, err = runner(
        [CONTROL], "get_server_list\n", {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}, TIMEOUT_S
    )
    if code != 0:
        return MpsStatus(
            device, pipe_dir, "unknown", (), (err or out).strip()[:200] or f"exit {code}"
        )
    pids = tuple(int(w) for w in out.split() if w.isdigit())
    return MpsStatus(device, pipe_dir, "running", pids, f"{len(pids)} MPS server(s)")
