"""Real `gpufleet` processes for end-to-end tests: start a command, read the JSON document it
prints when ready, run one-shot CLI commands, stop with a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GPUFLEET = [sys.executable, "-m", "gpufleet"]


def env_for(home: Path) -> dict[str, str]:
    """The test's environment with HOME moved into the test's directory and this tree's
    sources first on the path (the child imports the same gpufleet as the test)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "HOME": str(home), "PYTHONPATH": f"{src}:{path}" if path else src}


def start(
    args: list[str], home: Path, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[str], Any]:
    """Start ``gpufleet ARGS`` (which must print one JSON document when ready, ``--json``) and
    return the process and that document."""
    proc = subprocess.Popen(
        [*GPUFLEET, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(home),
    )
    assert proc.stdout is not None
    text = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        text += line
        try:
            return proc, json.loads(text)
        except ValueError:
            continue
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise AssertionError(f"gpufleet {' '.join(args)} did not start: {text!r} {err[-2000:]}")


def cli(args: list[str], home: Path, timeout_s: float = 60.0) -> Any:
    """Run a one-shot ``gpufleet ARGS --json`` and return its JSON answer."""
    out = subprocess.run(
        [*GPUFLEET, *args, "--json"],
        capture_output=True,
        text=True,
        env=env_for(home),
        timeout=timeout_s,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> str:
    """Send ``sig`` and wait for the process to end; returns its stderr. Fails when it has to
    be killed."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"process did not end within {timeout_s} s of signal {sig}") from None
    return err


def terminate(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL when the process has not ended within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
