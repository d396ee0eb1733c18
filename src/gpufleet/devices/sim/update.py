"""A simulated driver/VBIOS update (issues 15, 31): the update command of a campaign over
simulated nodes. ``python -m gpufleet.devices.sim.update --fleet FLEET --node NODE --driver V
[--cuda C] [--vbios V] [--after S]`` checks the request, waits ``S`` seconds (the update's
duration), then records the node's new state in the simulator's state directory
(`gpufleet.devices.sim.state`), where the node's agent finds it at its next start; the fleet
file itself is never written. The node then has driver ``V`` and reports the CUDA version
that driver supports (its branch's, from the catalog's table: `gpufleet.catalog.cuda`); a
``--cuda`` the driver cannot report (550.x with 13.0) is refused before anything happens.
An update fault for the node in the fleet file changes the outcome:

- ``update_no_return``: the node never comes back (the agent, ``GPUFLEET_AGENT_PID``, is
  stopped with SIGSTOP, as a node that hangs in its reboot);
- ``update_old_version``: the command succeeds, the versions stay as they were;
- ``update_fails_validation``: new versions, and a double-bit ECC error on GPU ``gpu`` (0 if
  not given) from the start, which the agent's level-1 validation fails;
- ``update_gpu_lost``: new versions, and GPU ``gpu`` (0) fallen off the bus on the reboot.

The node's update faults are consumed by its first update, as a real update happens once.
``--reset`` forgets every simulated update of the fleet file.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.catalog.cuda import driver_branch, driver_cuda, load_cuda_table, pair_problem
from gpufleet.devices.sim.faults import UPDATE_FAULTS, FaultKind
from gpufleet.devices.sim.gpu import DEFAULT_DRIVER
from gpufleet.devices.sim.state import (
    NodeState,
    clear_states,
    file_sha256,
    fleet_state_dir,
    read_states,
    write_state,
)
from gpufleet.errors import ConfigError, GpufleetError


@dataclass(frozen=True)
class Outcome:
    """What the update faults of a node make of its update."""

    hang: bool  # the node never comes back
    new_versions: bool  # the node has the target versions afterwards
    left: tuple[dict[str, Any], ...]  # faults the reboot leaves: {"kind", "gpu", params}


def outcome(update_faults: Iterable[tuple[str, int | None]]) -> Outcome:
    """The outcome of an update given the node's update faults as (kind, gpu) pairs."""
    pairs = [(FaultKind(k), g) for k, g in update_faults if FaultKind(k) in UPDATE_FAULTS]
    kinds = {k for k, _ in pairs}
    hang = FaultKind.UPDATE_NO_RETURN in kinds
    left: list[dict[str, Any]] = []
    for kind, gpu in pairs:
        if kind == FaultKind.UPDATE_FAILS_VALIDATION:
            left.append({"kind": FaultKind.ECC_DBE.value, "gpu": int(gpu or 0), "count": 1})
        elif kind == FaultKind.UPDATE_GPU_LOST:
            left.append({"kind": FaultKind.FALLEN_OFF_BUS.value, "gpu": int(gpu or 0)})
    return Outcome(hang, not hang and FaultKind.UPDATE_OLD_VERSION not in kinds, tuple(left))


def apply_update(
    doc: dict[str, Any], node: str, driver: str | None, vbios: str | None
) -> tuple[dict[str, Any], bool]:
    """A fleet document as the node's update leaves it (a new document: ``doc`` is not
    changed), and whether the node hangs (no return)."""
    faults = list(doc.get("faults") or [])
    mine = [f for f in faults if f.get("node") == node and f.get("kind") in UPDATE_FAULTS]
    rest = [f for f in faults if f not in mine]
    out_of = outcome((f["kind"], f.get("gpu")) for f in mine)
    nodes = [dict(e) for e in doc.get("nodes") or []]
    if out_of.new_versions:
        for entry in nodes:
            if entry.get("name") == node:
                if driver is not None:
                    entry["driver_version"] = driver
                if vbios is not None:
                    entry["vbios_version"] = vbios
    rest += [{"node": node, **f} for f in out_of.left]
    out = {**doc, "nodes": nodes}
    if rest:
        out["faults"] = rest
    else:
        out.pop("faults", None)
    return out, out_of.hang


def check_request(driver: str | None, cuda: str | None, current: str) -> str | None:
    """The CUDA version the node reports after the update, or a ConfigError naming the field:
    ``--driver`` not a version, ``--cuda`` not in the table or not what the driver reports."""
    if driver is not None and driver_branch(driver) is None:
        raise ConfigError(f"--driver {driver!r}: expected a driver version like 550.90.07")
    target = driver or current
    if cuda is not None:
        load_cuda_table().release(cuda)  # a ConfigError naming --cuda and the known releases
        problem = pair_problem(target, ".".join(cuda.strip().split(".")[:2]))
        if problem:
            raise ConfigError(f"--cuda {cuda}: {problem}")
    release = driver_cuda(target)
    return None if release is None else release.cuda


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="A simulated driver/VBIOS update of one node (the fleet file is not written)."
    )
    ap.add_argument("--fleet", type=Path, required=True)
    ap.add_argument("--node", default=os.environ.get("GPUFLEET_NODE"))
    ap.add_argument("--driver")
    ap.add_argument("--cuda", help="the CUDA version the node must report (checked, not set)")
    ap.add_argument("--vbios")
    ap.add_argument("--after", type=float, default=0.0, help="seconds the update takes")
    ap.add_argument("--reset", action="store_true", help="forget the fleet's simulated updates")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.reset:
        n = clear_states(args.fleet)
        print(
            f"forgot {n} simulated node update(s) of {args.fleet} ({fleet_state_dir(args.fleet)})"
        )
        return 0
    if not args.node:
        ap.error("--node (or GPUFLEET_NODE) is required")
    try:
        from gpufleet.devices.sim.spec import parse_fleet_yaml
        from gpufleet.devices.sim.state import apply_states
        from gpufleet.yamldoc import read_text_file

        spec = parse_fleet_yaml(read_text_file(args.fleet, "fleet file"), str(args.fleet))
        names = [n.name for n in spec.nodes]
        if args.node not in names:
            raise ConfigError(
                f"--node {args.node}: no such node in {args.fleet}",
                hint="nodes: " + ", ".join(names[:10]) + (", ..." if len(names) > 10 else ""),
            )
        sha = file_sha256(args.fleet)
        prior = read_states(args.fleet).get(args.node)
        now = apply_states(spec, {} if prior is None else {args.node: prior})
        ns = next(n for n in now.nodes if n.name == args.node)
        cuda = check_request(args.driver, args.cuda, ns.driver_version or DEFAULT_DRIVER)
    except GpufleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    time.sleep(max(0.0, args.after))
    mine = [f for f in now.faults if f.node == args.node and f.kind in UPDATE_FAULTS]
    result = outcome((f.kind.value, f.gpu) for f in mine)
    keep = result.new_versions
    state = NodeState(
        node=args.node,
        fleet_sha256=sha,
        driver_version=(args.driver if keep and args.driver else None)
        or (prior.driver_version if prior else None),
        vbios_version=(args.vbios if keep and args.vbios else None)
        or (prior.vbios_version if prior else None),
        faults=(*(prior.faults if prior else ()), *result.left),
        updates=(prior.updates + 1) if prior else 1,
    )
    path = write_state(args.fleet, state)
    if keep:
        driver = args.driver or ns.driver_version or DEFAULT_DRIVER
        said = f"driver {driver} (CUDA {cuda or 'unknown'})"
        said += f", vbios {args.vbios}" if args.vbios else ""
    else:
        said = "versions unchanged" if not result.hang else "the node does not come back"
    print(f"simulated update of {args.node}: {said}; state {path} ({args.fleet} not written)")
    pid = os.environ.get("GPUFLEET_AGENT_PID")
    if result.hang and pid:
        os.kill(int(pid), signal.SIGSTOP)  # the node hangs in its reboot
    elif pid:
        os.kill(int(pid), signal.SIGTERM)  # the reboot: the agent starts again (supervisor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
