"""Locked clocks that outlive the process, as on a real GPU (issue 31).

``nvmlDeviceSetGpuLockedClocks`` holds until a reset, a reboot or a driver reload (NVML API
Reference), not until the process that set it exits. A simulated GPU lives in a process, so a
simulated node read from a fleet file keeps its GPUs' locks beside the file's simulated update
states (`gpufleet.devices.sim.state`: the same directory per fleet file, 0700), one JSON file per
node (0600): every process that simulates the node (an agent, ``power sweep --sim``) starts with
the locks another left, and a reset clears them for all. That is what lets a test kill -9 a
sweep holding locks and see the next agent start reset them. Short specs (``1x8xh200``) name no
file and keep their locks in memory only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from gpufleet.errors import ConfigError

Locks = dict[int, tuple[int, int]]  # GPU index -> (min MHz, max MHz)


def lock_file(fleet: Path, node: str, root: Path | None = None) -> Path:
    """Where a node of ``fleet`` keeps its GPUs' locked clocks."""
    from gpufleet.devices.sim.state import fleet_state_dir

    return fleet_state_dir(fleet, root) / f"clocks-{quote(node, safe='')}.json"


def read_locks(path: Path) -> Locks:
    """The locks recorded in ``path``; none when there is no file."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {int(g): (int(lo), int(hi)) for g, (lo, hi) in doc["locked_mhz"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: not a simulated locked-clocks file: {exc}",
            hint="delete it: the simulated GPUs then start unlocked",
        ) from exc


def write_locks(path: Path, locks: Locks) -> None:
    """Record ``locks`` (atomically, 0600 in a 0700 directory); none removes the file."""
    if not locks:
        path.unlink(missing_ok=True)
        return
    from gpufleet.private import private_dir

    private_dir(path.parent)
    doc = {"locked_mhz": {str(g): list(v) for g, v in sorted(locks.items())}}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
