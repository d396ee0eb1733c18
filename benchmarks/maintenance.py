"""A maintenance campaign over a large simulated fleet (issue 15, Figures), run by the real
campaign engine on a real controller store (SQLite, manual clock), agents played here:

- N nodes (default 1,000) of 2 GPUs, one failure domain per rack (25 nodes a rack), 5 %
  batches, 90 % floor, one node per rack at once;
- per node: drain (the controller's own drain: ``--drain-s``), update (``--update-s``), reboot
  (``--reboot-s``), then the controller verifies versions and the node goes through the
  validation gate; ``--fail-every`` nodes come back with the old driver (failures handled);
- prints the campaign's simulated duration against the ideal (sum of per-node durations /
  allowed parallelism) and against one node at a time (kured's and the GPU Operator's default,
  computed as the sum of per-node durations), the minimum in-service fraction seen after
  every tick (must stay >= the floor), nodes updated and failures handled.

Jobs: this benchmark runs no job load (the drain waits for the scheduler to report the node
idle; it never kills a job), so "requeued with a checkpoint signal vs killed" is not measured
here; see docs/maintenance.md.

    python benchmarks/maintenance.py [--nodes 1000] [--tick-s 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.control import actions
from gpufleet.control import campaign_ops as ops
from gpufleet.control import campaigns as cp
from gpufleet.control.auth import Principal, Role
from gpufleet.control.ingest import parse_batch
from gpufleet.control.remediation import RemediationPolicy
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.store import IngestItem
from gpufleet.devices.sim import ManualClock
from gpufleet.wire import WireUpdateReport

OLD, NEW = "535.104.05", "550.90.07"
OP = Principal(1, "bench", Role.OPERATOR)
AGENT = Principal(None, "bench-agent", Role.AGENT)
T0 = 1_700_000_000.0


class Played:
    """The agents: each pushes a batch when asked, with its driver version."""

    def __init__(self, svc: ControlService, clock: ManualClock, gpus: int) -> None:
        self.svc, self.clock, self.gpus = svc, clock, gpus
        self.seq: dict[str, int] = {}
        self.version: dict[str, str] = {}

    def push(self, node: str) -> None:
        self.seq[node] = self.seq.get(node, 0) + 1
        t = self.clock()
        body: dict[str, Any] = {
            "schema_version": 1,
            "node": node,
            "agent_id": f"a-{node}",
            "seq": self.seq[node],
            "sent_at_s": t,
            "heartbeat_interval_s": 2.0,
            "devices": [
                {
                    "index": g,
                    "uuid": f"GPU-{node}-{g}",
                    "info": {"model": "h100-sxm", "driver_version": self.version[node]},
                }
                for g in range(self.gpus)
            ],
        }
        parsed = parse_batch(json.dumps(body).encode())
        self.svc.ingest.submit_sync(IngestItem(parsed.batch, AGENT, t, parsed.arrays))


def run(args: argparse.Namespace) -> dict[str, Any]:
    clock = ManualClock(T0)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-maint-", dir="/dev/shm"))
    policy = RemediationPolicy(max_out_fraction=0.2, require_validation=False)
    svc = ControlService(
        ServiceConfig(
            data_dir=tmp,
            policy=policy,
            min_drain_s=args.drain_s,
            lost_after_intervals=10**9,  # played agents only speak when they have news
            stall_s=1e12,  # the manual clock jumps a tick at a time: not a stalled loop
        ),
        clock=clock,
    )
    svc.ingest.start()
    agents = Played(svc, clock, args.gpus)
    names = [f"n{i:04d}" for i in range(args.nodes)]
    for n in names:
        agents.version[n] = OLD
        agents.push(n)
    for i, n in enumerate(names):
        actions.update_node(svc.store, n, OP, rack=f"r{i // args.rack_size:03d}")
    batch = max(1, math.floor(args.nodes * args.batch_pct / 100))
    spec = cp.CampaignSpec.model_validate(
        {
            "baseline": {"models": {"h100-sxm": {"driver": NEW}}},
            "batch": batch,
            "floor": args.floor,
            "per_domain": 1,
            "max_failures": args.nodes,
            "update_command": "site-update",
            "update_timeout_s": args.update_s * 3,
            "back_timeout_s": args.reboot_s * 3,
            "verify_timeout_s": args.tick_s * 2,
            "drain_timeout_s": args.drain_s * 10,
            "validate_timeout_s": args.tick_s * 10,
        }
    )
    cid = ops.start(svc.store, spec, OP)
    racks = math.ceil(args.nodes / args.rack_size)
    parallel = min(batch, racks, math.floor(args.nodes * (1 - args.floor) + 1e-9))
    ordered: dict[str, float] = {}  # node -> when its update began
    rebooting: dict[str, float] = {}  # node -> when it is back
    started = time.monotonic()
    min_in = 1.0
    ticks = 0
    while True:
        ticks += 1
        clock.advance(args.tick_s)
        now = clock()
        for node in dict(ops.orders(svc.store)):
            if node not in ordered:
                ordered[node] = now
        for node, t in list(ordered.items()):
            if t is not None and now - t >= args.update_s:
                bad = args.fail_every and int(node[1:]) % args.fail_every == 0
                agents.version[node] = OLD if bad else NEW
                rep = WireUpdateReport(node=node, key=cp.update_key(cid, node), exit_code=0)
                ops.report(svc.store, rep, Principal(None, "a", Role.AGENT, node=node))
                ordered[node] = math.inf
                rebooting[node] = now + args.reboot_s
        for node, back in list(rebooting.items()):
            if now >= back:
                agents.push(node)
                if svc.store.view.nodes[node].state in ("in_service", "repair"):
                    del rebooting[node]
        svc.tick()
        with svc.store.sessions() as s:
            in_gpus, total, _, _ = cp.capacity(svc.store, s)
        min_in = min(min_in, in_gpus / total)
        st = ops.status(svc.store, cid) if ticks % 10 == 0 else None
        if st is not None and st["state"] != "running":
            break
        if ticks > 10**6:
            raise RuntimeError("campaign did not end")
    duration = clock() - T0
    per_node = args.drain_s + args.update_s + args.reboot_s
    done = sum(1 for n in st["nodes"] if n["step"] == "done")
    failed = sum(1 for n in st["nodes"] if n["step"] == "failed")
    svc.ingest.stop()
    svc.engine.dispose()
    return {
        "nodes": args.nodes,
        "batch": batch,
        "floor": args.floor,
        "parallelism": parallel,
        "campaign_s": duration,
        "ideal_s": args.nodes * per_node / parallel,
        "one_at_a_time_s": args.nodes * per_node,
        "min_in_service": min_in,
        "nodes_updated": done,
        "failures_handled": failed,
        "state": st["state"],
        "wall_s": time.monotonic() - started,
        "tick_s": args.tick_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--rack-size", type=int, default=25)
    ap.add_argument("--batch-pct", type=float, default=5.0)
    ap.add_argument("--floor", type=float, default=0.9)
    ap.add_argument("--drain-s", type=float, default=900.0)
    ap.add_argument("--update-s", type=float, default=1200.0)
    ap.add_argument("--reboot-s", type=float, default=600.0)
    ap.add_argument("--tick-s", type=float, default=60.0)
    ap.add_argument("--fail-every", type=int, default=200, help="every Nth node fails verify")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return
    h = 3600.0
    print(
        f"{out['nodes']} nodes, batch {out['batch']}, floor {out['floor']:.0%}, "
        f"{out['parallelism']} at once (one per rack)\n"
        f"campaign {out['campaign_s'] / h:.1f} h simulated; ideal {out['ideal_s'] / h:.1f} h "
        f"(x{out['campaign_s'] / out['ideal_s']:.2f}); one node at a time "
        f"{out['one_at_a_time_s'] / h:.1f} h (x{out['one_at_a_time_s'] / out['campaign_s']:.1f} "
        f"slower)\n"
        f"minimum in-service fraction {out['min_in_service']:.3f} (floor {out['floor']:.2f}: "
        f"{'held' if out['min_in_service'] >= out['floor'] - 1e-9 else 'BROKEN'})\n"
        f"nodes updated {out['nodes_updated']}, failures handled {out['failures_handled']} "
        f"(campaign {out['state']}); jobs: none in this run (not measured)\n"
        f"wall {out['wall_s']:.0f} s at {out['tick_s']:g} s per controller tick"
    )


if __name__ == "__main__":
    main()
