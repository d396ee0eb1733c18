"""A simulated driver/VBIOS update (issue 15): the update command of a campaign over simulated
nodes. ``python -m gpufleet.devices.sim.update --fleet FLEET --node NODE --driver V
[--vbios V] [--after S]`` waits ``S`` seconds (the update's duration), then rewrites the fleet
file the node's agent reads at its next start: the node's ``driver_version`` and
``vbios_version`` become the targets, unless an update fault for the node says otherwise:

- ``update_no_return``: the node never comes back (the agent, ``GPUFLEET_AGENT_PID``, is
  stopped with SIGSTOP, as a node that hangs in its reboot);
- ``update_old_version``: the command succeeds, the versions stay as they were;
- ``update_fails_validation``: new versions, and a double-bit ECC error on GPU ``gpu`` (0 if
  not given) from the start, which the agent's level-1 validation fails;
- ``update_gpu_lost``: new versions, and GPU ``gpu`` (0) fallen off the bus on the reboot.

The update faults are consumed (removed from the file), as a real update happens once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from gpufleet.devices.sim.faults import UPDATE_FAULTS, FaultKind


def apply_update(
    doc: dict[str, Any], node: str, driver: str | None, vbios: str | None
) -> tuple[dict[str, Any], bool]:
    """The fleet document after the node's update, and whether the node hangs (no return)."""
    faults = list(doc.get("faults") or [])
    mine = [f for f in faults if f.get("node") == node and f.get("kind") in UPDATE_FAULTS]
    kinds = {FaultKind(f["kind"]) for f in mine}
    rest = [f for f in faults if f not in mine]
    hang = FaultKind.UPDATE_NO_RETURN in kinds
    if FaultKind.UPDATE_OLD_VERSION not in kinds and not hang:
        for entry in doc.get("nodes") or []:
            if entry.get("name") == node:
                if driver is not None:
                    entry["driver_version"] = driver
                if vbios is not None:
                    entry["vbios_version"] = vbios
    for f in mine:
        gpu = int(f.get("gpu") or 0)
        if f["kind"] == FaultKind.UPDATE_FAILS_VALIDATION:
            rest.append({"kind": "ecc_dbe", "node": node, "gpu": gpu, "count": 1})
        elif f["kind"] == FaultKind.UPDATE_GPU_LOST:
            rest.append({"kind": "fallen_off_bus", "node": node, "gpu": gpu})
    out = {**doc}
    if rest:
        out["faults"] = rest
    else:
        out.pop("faults", None)
    return out, hang


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A simulated driver/VBIOS update of one node.")
    ap.add_argument("--fleet", type=Path, required=True)
    ap.add_argument("--node", default=os.environ.get("GPUFLEET_NODE"))
    ap.add_argument("--driver")
    ap.add_argument("--vbios")
    ap.add_argument("--after", type=float, default=0.0, help="seconds the update takes")
    args = ap.parse_args(argv)
    if not args.node:
        ap.error("--node (or GPUFLEET_NODE) is required")
    time.sleep(max(0.0, args.after))
    try:
        doc = yaml.safe_load(args.fleet.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        print(f"{args.fleet}: {exc}", file=sys.stderr)
        return 2
    new, hang = apply_update(doc, args.node, args.driver, args.vbios)
    tmp = args.fleet.with_name(args.fleet.name + ".tmp")
    tmp.write_text(json.dumps(new), encoding="utf-8")  # JSON is YAML
    os.replace(tmp, args.fleet)
    print(f"simulated update of {args.node}: driver {args.driver}, vbios {args.vbios}")
    pid = os.environ.get("GPUFLEET_AGENT_PID")
    if hang and pid:
        os.kill(int(pid), signal.SIGSTOP)  # the node hangs in its reboot
    elif pid:
        os.kill(int(pid), signal.SIGTERM)  # the reboot: the agent starts again (supervisor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
