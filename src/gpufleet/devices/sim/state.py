"""The simulator's memory of its updates (issue 31): what a simulated update
(`gpufleet.devices.sim.update`) did to a node, kept outside the user's fleet file, which is
never written.

One JSON file per node (0600) in a directory per fleet file (0700) under the simulator's state
directory: ``$GPUFLEET_SIM_STATE_DIR``, else ``$XDG_STATE_HOME/gpufleet/sim``
(``~/.local/state/gpufleet/sim``). The directory is named after the fleet file's resolved path
(``fleet-<sha256 of the path, 16 hex>``); each state records the sha256 of the fleet file's bytes
when it was written, and applies only while the file still has those bytes: a fleet file
edited since describes another fleet, and its old update states are ignored. Every reader of
a fleet file (`parse_fleet_spec`: an agent started again after its update, ``gpufleet up``'s
in-place reopen, ``health``/``validate --sim``) sees the updated versions, the update faults
consumed and the faults the update left.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpufleet.devices.sim.faults import UPDATE_FAULTS, Fault, FaultKind
from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    from gpufleet.devices.sim.spec import FleetSpec

STATE_ENV = "GPUFLEET_SIM_STATE_DIR"
RESET_HINT = "python -m gpufleet.devices.sim.update --fleet FLEET --reset forgets them"


def state_root() -> Path:
    """``$GPUFLEET_SIM_STATE_DIR``, else ``$XDG_STATE_HOME/gpufleet/sim``."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "gpufleet" / "sim"


def fleet_state_dir(fleet: Path, root: Path | None = None) -> Path:
    """The directory of one fleet file's update states."""
    real = fleet.resolve()
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", real.stem)[:40] or "fleet"
    tag = hashlib.sha256(str(real).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return (root or state_root()) / f"{stem}-{tag}"


def _node_file(directory: Path, node: str) -> Path:
    return directory / f"node-{quote(node, safe='')}.json"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class NodeState:
    """A node after its simulated updates: the versions it has now (None: the fleet file's),
    and the faults its last reboot left (``{"kind": ..., "gpu": ..., params}``). The node's
    update faults of the fleet file were consumed by its first update."""

    node: str
    fleet_sha256: str
    driver_version: str | None = None
    vbios_version: str | None = None
    faults: tuple[dict[str, Any], ...] = ()
    updates: int = 1

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "faults": [dict(f) for f in self.faults]}

    @classmethod
    def from_json(cls, doc: Any, where: Path) -> NodeState:
        try:
            if not isinstance(doc, dict):
                raise TypeError("not a mapping")
            faults = tuple(dict(f) for f in doc.get("faults") or [])
            for f in faults:
                FaultKind(f["kind"])
            return cls(
                node=str(doc["node"]),
                fleet_sha256=str(doc["fleet_sha256"]),
                driver_version=doc.get("driver_version"),
                vbios_version=doc.get("vbios_version"),
                faults=faults,
                updates=int(doc.get("updates") or 1),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{where}: not a simulated update state ({exc})", hint=RESET_HINT
            ) from exc


def read_states(fleet: Path, root: Path | None = None) -> dict[str, NodeState]:
    """The update states of the fleet file as it is now (states of other bytes are ignored)."""
    directory = fleet_state_dir(fleet, root)
    if not directory.is_dir():
        return {}
    files = sorted(directory.glob("node-*.json"))
    if not files:
        return {}
    sha = file_sha256(fleet)
    out: dict[str, NodeState] = {}
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: unreadable update state: {exc}", hint=RESET_HINT) from exc
        state = NodeState.from_json(doc, path)
        if state.fleet_sha256 == sha:
            out[state.node] = state
    return out


def _private_dir(path: Path) -> None:
    for p in reversed([path, *path.parents]):
        if not p.exists():
            p.mkdir(mode=0o700)
            os.chmod(p, 0o700)  # the mode without the umask
    os.chmod(path, 0o700)


def write_state(fleet: Path, state: NodeState, root: Path | None = None) -> Path:
    """Write one node's state (0600, atomically: a reader sees the old file or the new)."""
    directory = fleet_state_dir(fleet, root)
    _private_dir(directory)
    path = _node_file(directory, state.node)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(state.to_json(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def clear_states(fleet: Path, root: Path | None = None) -> int:
    """Forget every update of the fleet file; the number of node states removed."""
    directory = fleet_state_dir(fleet, root)
    files = sorted(directory.glob("node-*.json")) if directory.is_dir() else []
    for path in files:
        path.unlink(missing_ok=True)
    return len(files)


def _fault(node: str, entry: dict[str, Any]) -> Fault:
    params = {k: v for k, v in entry.items() if k not in ("kind", "node", "gpu")}
    gpu = entry.get("gpu")
    return Fault(
        kind=FaultKind(entry["kind"]),
        node=node,
        gpu=None if gpu is None else int(gpu),
        params=params,
    )


def apply_states(spec: FleetSpec, states: dict[str, NodeState]) -> FleetSpec:
    """``spec`` as its nodes are after their updates."""
    if not states:
        return spec
    nodes = tuple(
        dataclasses.replace(
            n,
            driver_version=s.driver_version or n.driver_version,
            vbios_version=s.vbios_version or n.vbios_version,
        )
        if (s := states.get(n.name)) is not None
        else n
        for n in spec.nodes
    )
    kept = tuple(f for f in spec.faults if not (f.node in states and f.kind in UPDATE_FAULTS))
    left = tuple(_fault(s.node, f) for s in states.values() for f in s.faults)
    return dataclasses.replace(spec, nodes=nodes, faults=(*kept, *left))


def with_sim_state(spec: FleetSpec, fleet: Path) -> FleetSpec:
    """The fleet read from ``fleet`` as its simulated updates left it."""
    known = {n.name for n in spec.nodes}
    states = {k: v for k, v in read_states(fleet).items() if k in known}
    return apply_states(spec, states)
