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

Jobs (``--jobs``, on by default): the controller runs the embedded scheduler; every node's
agent (played here: its jobs report and the commands it gets, through the scheduler's real
exchange) runs one 2-GPU job at a time, each lasting an exponential time (mean ``--job-h``
hours), a new one submitted whenever one ends. A drain that reaches its deadline
(``--deadline-s``, by default the planned ``--drain-s``: the deadline makes the plan's drain
time hold) has the scheduler checkpoint-signal and requeue the jobs still running; a
played job exits ``--checkpoint-s`` after the signal (or is killed when its grace runs out).
Prints jobs requeued with the signal vs killed without it (the campaign's count) and, on the
agents' side, copies that exited in their grace vs killed at its end.

    python benchmarks/maintenance.py [--nodes 1000] [--tick-s 60] [--no-jobs] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.control.campaigns import engine as cp
from gpufleet.control.campaigns import ops
from gpufleet.control.fleet import actions
from gpufleet.control.ingest.queue import parse_batch
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.control.state.store import IngestItem
from gpufleet.devices.sim import ManualClock
from gpufleet.schedulers.base import JobSpec, SchedulerContext
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.wire import Batch, WireCommand, WireUpdateReport

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


class PlayedJobs:
    """The agents' side of the embedded scheduler: each node's copies of jobs, its jobs report
    every tick (through `EmbeddedBackend.exchange`) and the start/kill commands it answers."""

    def __init__(self, backend: EmbeddedBackend, clock: ManualClock, args: argparse.Namespace):
        import random

        self.backend, self.clock, self.args = backend, clock, args
        self.rng = random.Random(15)
        self.seq: dict[str, int] = {}
        # node -> (job, generation) -> [running, ends_at, exit_code, reason]
        self.copies: dict[str, dict[tuple[str, int], list[Any]]] = {}
        self.in_grace = self.killed_at_grace = self.killed_plain = 0
        self.submitted = 0

    def submit(self) -> None:
        self.submitted += 1
        hours = self.rng.expovariate(1.0 / self.args.job_h)
        self.backend.submit(
            JobSpec(name=f"train{self.submitted}", gpus=2, duration_s=max(60.0, hours * 3600))
        )

    def exchange(self, node: str) -> None:
        now = self.clock()
        mine = self.copies.setdefault(node, {})
        ended = 0
        for k, c in list(mine.items()):
            if c[0] and now >= c[1]:
                c[0], ended = False, ended + (c[2] == 0)
            elif not c[0] and now - c[1] > 600:
                del mine[k]  # reported long enough (an agent keeps finished copies a while)
        self.seq[node] = self.seq.get(node, 0) + 1
        body = {
            "schema_version": 1,
            "node": node,
            "agent_id": f"a-{node}",
            "seq": self.seq[node],
            "sent_at_s": now,
            "heartbeat_interval_s": 2.0,
            "jobs": {
                "lease_s": 30,
                "slots": [
                    {"index": g, "model": "h100-sxm", "memory_bytes": 80 << 30}
                    for g in range(self.args.gpus)
                ],
                "copies": [
                    {
                        "job_id": k[0],
                        "generation": k[1],
                        "running": c[0],
                        "exit_code": None if c[0] else c[2],
                        "reason": c[3],
                        "fenced": c[2] is None and not c[0],
                    }
                    for k, c in mine.items()
                ],
            },
        }
        for cmd in self.backend.exchange(Batch.model_validate(body), now):
            self.apply(node, cmd, now)
        for _ in range(ended):
            self.submit()  # the fleet stays busy

    def apply(self, node: str, cmd: WireCommand, now: float) -> None:
        mine = self.copies.setdefault(node, {})
        key = (cmd.job_id, cmd.generation)
        c = mine.get(key)
        if cmd.op == "start":
            if c is None:
                spec = cmd.spec
                dur = spec.duration_s if spec is not None and spec.duration_s else 3600.0
                mine[key] = [True, now + dur, 0, ""]
            return
        if c is None or not c[0] or c[2] is None:
            return  # gone already, or its stop was counted
        if cmd.signal:  # a checkpoint stop: it saves its state and exits, or is killed
            ok = self.args.checkpoint_s <= cmd.grace_s
            c[1] = now + min(self.args.checkpoint_s, cmd.grace_s)
            self.in_grace += ok
            self.killed_at_grace += not ok
            c[3] = "checkpointed" if ok else "killed after the grace"
        else:
            c[1] = now
            self.killed_plain += 1
            c[3] = "killed"
        c[2] = None  # stopped by the agent: an infrastructure stop


def run(args: argparse.Namespace) -> dict[str, Any]:
    clock = ManualClock(T0)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-maint-", dir="/dev/shm"))
    policy = RemediationPolicy(max_out_fraction=0.2, require_validation=False)
    backend = EmbeddedBackend(tick_s=1e9) if args.jobs else None  # ticked below
    svc = ControlService(
        ServiceConfig(
            data_dir=tmp,
            policy=policy,
            min_drain_s=args.drain_s,
            lost_after_intervals=10**9,  # played agents only speak when they have news
            stall_s=1e12,  # the manual clock jumps a tick at a time: not a stalled loop
        ),
        clock=clock,
        scheduler=backend,
    )
    svc.ingest.start()
    played = None
    if backend is not None:
        from gpufleet.control.jobs.events import node_facts

        backend.start(SchedulerContext(svc.engine, clock, lambda node: node_facts(svc.store, node)))
        played = PlayedJobs(backend, clock, args)
    agents = Played(svc, clock, args.gpus)
    names = [f"n{i:04d}" for i in range(args.nodes)]
    for n in names:
        agents.version[n] = OLD
        agents.push(n)
    for i, n in enumerate(names):
        actions.update_node(svc.store, n, OP, rack=f"r{i // args.rack_size:03d}")
    if played is not None and backend is not None:
        for n in names:
            played.exchange(n)  # the nodes join the scheduler
            played.submit()
        backend.tick()
        for n in names:
            played.exchange(n)  # the jobs start
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
            "drain_deadline_s": args.deadline_s or args.drain_s,
            "checkpoint_grace_s": args.grace_s,
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
        if played is not None and backend is not None:
            for n in names:
                if n not in rebooting and not (n in ordered and ordered[n] != math.inf):
                    played.exchange(n)  # a node in its update or reboot does not report
            backend.tick()
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
    if backend is not None:
        backend.stop()
    svc.engine.dispose()
    jobs = {
        "campaign_requeued_with_signal": st["requeued"]["signalled"],
        "campaign_killed_without_signal": st["requeued"]["killed"],
        "nodes_past_deadline": st["requeued"]["nodes"],
        "agent_exited_in_grace": played.in_grace if played else 0,
        "agent_killed_at_grace_end": played.killed_at_grace if played else 0,
        "agent_killed_without_signal": played.killed_plain if played else 0,
        "jobs_submitted": played.submitted if played else 0,
    }
    return {
        "jobs": jobs if played else None,
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
    ap.add_argument("--jobs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--job-h", type=float, default=6.0, help="mean job length, hours")
    ap.add_argument(
        "--deadline-s", type=float, default=None, help="drain deadline (default: --drain-s)"
    )
    ap.add_argument("--grace-s", type=float, default=60.0, help="checkpoint grace")
    ap.add_argument("--checkpoint-s", type=float, default=20.0, help="a job's checkpoint time")
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
        f"(campaign {out['state']})\n"
        + _jobs_line(out["jobs"])
        + f"wall {out['wall_s']:.0f} s at {out['tick_s']:g} s per controller tick"
    )


def _jobs_line(j: dict[str, int] | None) -> str:
    if j is None:
        return "jobs: none in this run (--no-jobs)\n"
    return (
        f"jobs ({j['jobs_submitted']} submitted): {j['nodes_past_deadline']} drains reached the "
        f"deadline; requeued with the checkpoint signal {j['campaign_requeued_with_signal']}, "
        f"killed without it {j['campaign_killed_without_signal']}; on the agents: exited in "
        f"their grace {j['agent_exited_in_grace']}, killed when it ran out "
        f"{j['agent_killed_at_grace_end']}, killed with no signal "
        f"{j['agent_killed_without_signal']}\n"
    )


if __name__ == "__main__":
    main()
