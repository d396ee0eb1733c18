"""What one simulated node costs `gpufleet sim-fleet`: memory and CPU per simulated 8-GPU node,
every agent part enabled (sampler, health rules, spool, push to a real controller, job runner).

Each node is the real agent (`gpufleet.agent.fleet.FleetDriver`); the controller runs in its
own process (`gpufleet controller`), so its CPU is not counted. Two phases in one run:

1. NODES nodes at the stated interval (--interval, default 10 s): memory per node as the RSS
   growth over the process before the fleet existed, divided by NODES, split into the
   simulator's share (measured first, alone) and the agents'; CPU per node as process CPU time
   over wall time over NODES;
2. SMALL nodes at 1 Hz: CPU per node at 1 Hz, against the idle process as the baseline.

    python benchmarks/simfleet_scale.py [--nodes 1000] [--interval 10] [--seconds 60]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import start_controller  # type: ignore[import-not-found]

TARGET_KB_PER_NODE = 200.0  # issue 11


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_fleet(
    nodes: int, interval_s: float, push_s: float, seconds: float, url: str, token: str, tmp: Path
) -> dict[str, Any]:
    from gpufleet.agent.fleet import FleetConfig, FleetDriver, job_runners
    from gpufleet.devices.sim import SimFleet
    from gpufleet.devices.sim.spec import parse_short_spec

    gc.collect()
    r0 = rss_bytes()
    sim = SimFleet(parse_short_spec(f"{nodes}x8xh100-sxm", prefix=f"s{int(interval_s * 10)}"))
    sim.demo_activity()
    backends = sim.backends()
    for b in backends:  # the simulator's own state, touched once, before any agent exists
        for i in range(b.device_count()):
            b.device_info(i)
    gc.collect()
    r_sim = rss_bytes()
    cfg = FleetConfig(
        controller=url,
        token=token,
        state_dir=tmp / f"agents-{nodes}-{interval_s:g}",
        fast_interval_s=interval_s,
        push_interval_s=push_s,
    )
    driver = FleetDriver(backends, cfg, jobs=job_runners(backends, sim, tmp / "jobs"))
    stop = threading.Event()
    c0, w0 = time.process_time(), time.monotonic()
    driver.start()
    # memory once every node has sampled and pushed a few times (rings full, health made)
    stop.wait(seconds)
    wall = time.monotonic() - w0
    cpu = time.process_time() - c0
    gc.collect()
    r1 = rss_bytes()
    stats = driver.stats()
    driver.stop(flush=False)
    return {
        "nodes": nodes,
        "interval_s": interval_s,
        "push_interval_s": push_s,
        "seconds": round(wall, 1),
        "kb_per_node": round((r1 - r0) / nodes / 1024, 1),
        "sim_kb_per_node": round((r_sim - r0) / nodes / 1024, 1),
        "agent_kb_per_node": round((r1 - r_sim) / nodes / 1024, 1),
        "cpu_pct_of_core": round(cpu / wall * 100, 2),
        "cpu_pct_per_node": round(cpu / wall * 100 / nodes, 4),
        "gpu_samples": stats.gpu_samples,
        "batches_acked": stats.batches_acked,
        "errors": stats.errors,
        "late_rounds": stats.late_rounds,
        "push_p99_ms": stats.push_p99_ms,
    }


def idle_cpu_pct(seconds: float) -> float:
    c0, w0 = time.process_time(), time.monotonic()
    threading.Event().wait(seconds)
    return (time.process_time() - c0) / (time.monotonic() - w0) * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=10.0, help="sampling interval (s)")
    ap.add_argument("--push-interval", type=float, default=None, help="default: 2 x interval")
    ap.add_argument("--seconds", type=float, default=60.0, help="per phase")
    ap.add_argument("--small", type=int, default=50, help="nodes of the 1 Hz phase")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-simscale-"))
    server, base, token = start_controller(tmp / "controller")
    import gpufleet.agent.fleet
    import gpufleet.health.tracker
    import gpufleet.schedulers.embedded  # noqa: F401

    try:
        base_cpu = idle_cpu_pct(3.0)
        big = run_fleet(
            args.nodes,
            args.interval,
            args.push_interval or 2 * args.interval,
            args.seconds,
            base,
            token,
            tmp,
        )
        hz = run_fleet(args.small, 1.0, 5.0, min(args.seconds, 30.0), base, token, tmp)
    finally:
        server.terminate()
        server.wait(timeout=30)
    out = {
        "fleet": big,
        "one_hz": hz,
        "idle_cpu_pct": round(base_cpu, 3),
        "target_kb_per_node": TARGET_KB_PER_NODE,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"memory: {big['kb_per_node']} KB per simulated 8-GPU node "
        f"(simulator {big['sim_kb_per_node']} KB + agent {big['agent_kb_per_node']} KB; "
        f"{big['kb_per_node'] / TARGET_KB_PER_NODE:.2f}x the {TARGET_KB_PER_NODE:g} KB target) "
        f"[{big['nodes']} nodes]"
    )
    print(
        f"CPU at {big['interval_s']:g} s: {big['cpu_pct_per_node']} % of a core per node, "
        f"{big['cpu_pct_of_core']} % for {big['nodes']} nodes "
        f"({big['gpu_samples']:,} GPU samples, {big['batches_acked']} batches acked, "
        f"{big['errors']} errors, {big['late_rounds']} late rounds, push p99 "
        f"{big['push_p99_ms']} ms)"
    )
    print(
        f"CPU at 1 Hz: {hz['cpu_pct_per_node']} % of a core per node "
        f"({hz['nodes']} nodes: {hz['cpu_pct_of_core']} %; idle process {out['idle_cpu_pct']} %)"
    )


if __name__ == "__main__":
    main()
