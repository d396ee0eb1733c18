"""Process set-up shared by the long-running commands (`controller`, `up`, `agent`,
`sim-fleet`) and the commands that write their state (`token`): a private umask and private
state directories, and SIGTERM handled like Ctrl-C.

systemd, Docker and Kubernetes stop a service with SIGTERM, whose default action ends the
process on the spot, skipping every ``finally``; turned into `KeyboardInterrupt` it takes the
same shutdown path as Ctrl-C (uvicorn and the agent install their own handlers for both while
they run).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from gpufleet.errors import ConfigError, UsageError
from gpufleet.private import PRIVATE_UMASK, private_dir, tighten


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `KeyboardInterrupt` in the main thread, as SIGINT does."""
    signal.signal(signal.SIGTERM, _interrupt)


def private_state(*dirs: Path | None) -> None:
    """Files this process creates are 0600 and directories 0700 (umask 077); ``dirs`` (state
    directories: the controller's data directory, the agent's state directory) are created 0700
    and what an older version left in them readable by others is tightened."""
    os.umask(PRIVATE_UMASK)
    for d in dirs:
        if d is None:
            continue
        try:
            private_dir(d)
            tighten(d, recursive=True)
        except OSError as exc:
            raise ConfigError(f"state directory {d}: {exc.strerror or exc}") from exc


TlsCertOption = typer.Option(
    None, "--tls-cert", help="PEM certificate (chain) to serve HTTPS with; needs --tls-key."
)
TlsKeyOption = typer.Option(None, "--tls-key", help="PEM private key of --tls-cert.")
CaOption = typer.Option(
    None,
    "--ca",
    envvar="GPUFLEET_CA",
    help="PEM CA bundle to verify an https:// controller with (default: system trust store).",
)


def check_gpu_limit(backends: list[Any], option: str) -> None:
    """A node with more GPUs than the control plane takes (`MAX_GPUS_PER_NODE`) would have every
    batch refused: say so at start, naming the option and the limit."""
    from gpufleet.wire.limits import MAX_GPUS_PER_NODE

    for b in backends:
        n = b.device_count()
        if n > MAX_GPUS_PER_NODE:
            raise UsageError(
                f"{option}: node {b.node_name} has {n} GPUs; the control plane takes at most "
                f"{MAX_GPUS_PER_NODE} per node"
            )
