"""Scale benchmark: NODES simulated nodes x 8 GPUs replayed into `gpufleet controller` on
PostgreSQL at the agents' default cadence (1 Hz sampling, a push every 5 s: 8 GPU samples per
node per second; the issue's fleet, 10,000 nodes, is 80,000 GPU samples/s in 2,000 batches/s),
with the dashboard's API calls running alongside. It reports:

- ingest per core: GPU samples acknowledged per CPU-second of the controller process(es), and
  of PostgreSQL, over the paced window; whether the offered rate was held; ack p50/p99;
- API p99 of the dashboard's calls (summary, grouped heatmap, attention list, findings, one
  page of the nodes table) from a separate poller process during the load;
- controller memory per node: RSS growth from the empty controller to the loaded one / NODES;
- time per tick of the breaker, lifecycle (lost detection, drain completion, blocked-drain
  retries: the remediation loop) and campaign passes, and of a whole background tick, measured
  in this process on the same database after the load (the controller stopped; one writer);
- what it takes to hold the 10,000-node load: cores for the controller and PostgreSQL and
  controller processes, EXTRAPOLATED linearly from the measured per-core figures.

Replay means synthetic wire batches: the real agent (`benchmarks/ingest.py render_pool`)
samples the simulator once per node shape and builds its default batch (8 GPUs x 5 samples,
fast and slow tiers); each node's batch is then pushed every 5 s with a fresh sequence number,
spread evenly over the 5 s, by one asyncio client over keep-alive connections. No agent
process runs per node. Registration (each node's first batch, with its devices) is pushed as
fast as the controller acknowledges, and timed on its own.

PostgreSQL: a private server (Debian's `postgresql`, initdb as the `postgres` user, like the
tests) unless `--db-url` names one. `--replicas 2` starts two controllers on the same database
and splits the nodes between them (the agents' `--controller URL1,URL2`): one leads (the
timers), both ingest and serve reads; the figures in docs/control-plane.md are with one replica.

    python benchmarks/scale.py [--nodes 1000] [--duration 60] [--replicas 1|2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

# the ingest benchmark's client and batch builder (run as a script: the repository root is not
# on the path by itself)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.ingest import Connection, process_cpu_s, render_pool

PUSH_S = 5.0  # the agent's default push interval (gpufleet agent --push-interval)
TARGET_NODES = 10_000
GPUS = 8
# the dashboard's calls at 10,000 nodes, as overview.js / nodes.js make them (a 1440 x 900
# window: a cell budget of about 14,000 GPU cells)
DASHBOARD_CALLS = (
    "/api/v1/summary",
    "/api/v1/heatmap?metric=gpu_util_pct&group_by=rack&max_cells=14000",
    "/api/v1/nodes?attention=true&sort=attention&gpus=false&limit=200",
    "/api/v1/findings?active=true&limit=2000",
    "/api/v1/nodes?gpus=true&limit=100&offset=0&sort=name",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds of ``root_pid`` and its children now alive (PostgreSQL: the postmaster and
    its backends)."""
    pids = [root_pid]
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == root_pid:
            pids.append(int(Path(stat).parent.name))
    return sum(process_cpu_s(p) for p in pids)


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, int]]:
    """A PostgreSQL server on a loopback port as the `postgres` user: (URL, postmaster pid)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found or shutil.which("runuser") is None:
        sys.exit("PostgreSQL not found (apt-get install postgresql), or pass --db-url")
    bindir = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="gpufleet-scale-pg-"))
    os.chmod(root, 0o777)
    data, port = root / "data", free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200"
    ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log")]
    subprocess.run(
        [*as_pg, *ctl, "-o", opts, "start"],
        check=True,
        capture_output=True,
    )
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", pid
    finally:
        subprocess.run(
            [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def gpufleet(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def start_controller(db_url: str, policy: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = ["controller", "--db-url", db_url, "--port", str(port), "--policy", str(policy)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args, "--max-nodes-per-token", "0"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"controller exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{base}/api/v1/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    sys.exit(f"controller did not answer; see {log}")


async def push_all(
    bases: list[str],
    token: str,
    bodies: list[tuple[int, str]],
    seq0: int,
    *,
    rate: float | None,
    duration: float,
    concurrency: int,
) -> dict[str, Any]:
    """Push ``bodies`` ((replica, JSON with "seq":0)) round-robin: as fast as acknowledged
    (``rate`` None, once each) or paced at ``rate`` batches/s for ``duration`` s."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    hostports = [b.split("//", 1)[1].split(":") for b in bases]
    lat: list[float] = []
    done = errors = throttled = 0
    late_s = 0.0
    t0 = time.monotonic()
    total = len(bodies) if rate is None else int(rate * duration)
    nxt = 0

    async def worker() -> None:
        nonlocal done, errors, throttled, nxt, late_s
        conns = [Connection(h, int(p)) for h, p in hostports]
        while True:
            k = nxt
            if k >= total:
                return
            nxt += 1
            if rate is not None:
                due = t0 + k / rate
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    late_s = max(late_s, -wait)
            replica, text = bodies[k % len(bodies)]
            seq = seq0 + k // len(bodies)
            raw = text.replace('"seq":0', f'"seq":{seq}', 1).encode()
            t = time.perf_counter()
            status, _ = await conns[replica].request("/api/v1/ingest", raw, headers)
            if status == 200:
                done += 1
                lat.append((time.perf_counter() - t) * 1000)
            elif status == 429:
                throttled += 1
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.monotonic() - t0
    return {
        "batches": done,
        "errors": errors,
        "throttled": throttled,
        "wall_s": round(wall, 2),
        "batches_per_s": round(done / wall, 1),
        "ack_p50_ms": round(pct(lat, 50), 1),
        "ack_p99_ms": round(pct(lat, 99), 1),
        "max_lag_s": round(late_s, 2),
    }


def poll(base: str, token: str, duration: float) -> None:
    """The dashboard's calls in a loop (a separate process: its latencies are the server's,
    not this client's event loop); prints {path: [ms, ...]} as JSON."""
    out: dict[str, list[float]] = {p: [] for p in DASHBOARD_CALLS}
    end = time.monotonic() + duration
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as c:
        while time.monotonic() < end:
            for path in DASHBOARD_CALLS:
                t = time.perf_counter()
                c.get(path, timeout=30).raise_for_status()
                out[path].append((time.perf_counter() - t) * 1000)
            time.sleep(0.5)
    print(json.dumps(out))


def loop_ticks(db_url: str, rounds: int = 20) -> dict[str, Any]:
    """Median ms per pass of each background loop, on the loaded database, in this process."""
    import logging

    from gpufleet.control.campaigns import ops as campaign_ops
    from gpufleet.control.service import ControlService, ServiceConfig
    from gpufleet.control.state.remediation import RemediationPolicy

    logging.getLogger("gpufleet").setLevel(logging.ERROR)
    t = time.perf_counter()
    svc = ControlService(
        ServiceConfig(db_url=db_url, policy=RemediationPolicy(require_validation=False)),
        auto_migrate=False,
    )
    load_ms = (time.perf_counter() - t) * 1000
    store = svc.store

    def timed(fn: Any) -> list[float]:
        out = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)
        return out

    first = timed(store.check_nodes)[:1]  # drains whose min time passed complete here
    res = {
        "nodes_loaded": len(store.nodes),
        "cache_load_ms": round(load_ms, 1),
        "lifecycle_first_ms": round(first[0], 1),
        "lifecycle_ms": statistics.median(timed(store.check_nodes)),
        "breaker_ms": statistics.median(timed(lambda: store.writer.call(store.out_count))),
        "campaigns_ms": statistics.median(timed(lambda: campaign_ops.tick(store))),
        "tick_ms": statistics.median(timed(svc.tick)),
    }
    svc.engine.dispose()
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=60.0, help="paced window, seconds")
    ap.add_argument("--replicas", type=int, default=1, choices=(1, 2))
    ap.add_argument(
        "--db-url", help="a scratch PostgreSQL database (migrated, then filled with the nodes)"
    )
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--poll", nargs=3, metavar=("BASE", "TOKEN", "SECONDS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.poll:
        poll(a.poll[0], a.poll[1], float(a.poll[2]))
        return
    with contextlib.ExitStack() as stack:
        if a.db_url:
            db_url, pg_pid = a.db_url, None
        else:
            db_url, pg_pid = stack.enter_context(private_postgres())
        res = run(a, db_url, pg_pid)
    report(res, a.json)


def run(a: argparse.Namespace, db_url: str, pg_pid: int | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-scale-"))
    policy = tmp / "policy.yaml"
    policy.write_text("require_validation: false\n")
    gpufleet("controller", "migrate", "--db-url", db_url)
    agent = json.loads(gpufleet("token", "create", "--role", "agent", "--db-url", db_url, "--json"))
    viewer = json.loads(
        gpufleet("token", "create", "--role", "viewer", "--db-url", db_url, "--json")
    )
    procs = [
        start_controller(db_url, policy, tmp / f"controller{r}.log") for r in range(a.replicas)
    ]
    bases = [b for _, b in procs]
    pids = [p.pid for p, _ in procs]
    try:
        time.sleep(1.0)
        rss0 = sum(rss_bytes(p) for p in pids)
        pool = render_pool(a.nodes, GPUS, int(PUSH_S))
        per_batch = len({(s["gpu_index"], t) for s in pool[0][2]["samples"] for t in s["t"]})
        first, later = [], []
        for i, (_, _, body) in enumerate(pool):
            b = dict(body, seq=0)
            first.append((i % a.replicas, json.dumps(b, separators=(",", ":"))))
            b.pop("devices", None)
            later.append((i % a.replicas, json.dumps(b, separators=(",", ":"))))
        t = time.monotonic()
        reg = asyncio.run(
            push_all(bases, agent["token"], first, 1, rate=None, duration=0, concurrency=32)
        )
        reg_s = time.monotonic() - t
        rate = a.nodes / PUSH_S
        poller = subprocess.Popen(
            [sys.executable, __file__, "--poll", bases[0], viewer["token"], str(a.duration - 5)],
            stdout=subprocess.PIPE,
        )
        cpu0 = sum(process_cpu_s(p) for p in pids)
        pg0 = tree_cpu_s(pg_pid) if pg_pid else 0.0
        w0 = time.monotonic()
        load = asyncio.run(
            push_all(
                bases,
                agent["token"],
                later,
                2,
                rate=rate,
                duration=a.duration,
                concurrency=a.concurrency,
            )
        )
        wall = time.monotonic() - w0
        cpu = sum(process_cpu_s(p) for p in pids) - cpu0
        pg_cpu = (tree_cpu_s(pg_pid) - pg0) if pg_pid else None
        polled = json.loads(poller.communicate(timeout=120)[0] or b"{}")
        rss1 = sum(rss_bytes(p) for p in pids)
    finally:
        for p, _ in procs:
            p.terminate()
        for p, _ in procs:
            p.wait(timeout=60)
    ticks = loop_ticks(db_url)
    shutil.rmtree(tmp, ignore_errors=True)  # controller logs: kept only when a run fails
    samples = load["batches"] * per_batch
    return {
        "nodes": a.nodes,
        "gpus": a.nodes * GPUS,
        "replicas": a.replicas,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "samples_per_batch": per_batch,
        "registration": {
            **reg,
            "s": round(reg_s, 1),
            "ms_per_node": round(1000 * reg_s / a.nodes, 2),
        },
        "offered_batches_per_s": rate,
        "offered_samples_per_s": rate * per_batch,
        "load": load,
        "samples_per_s": round(samples / wall),
        "controller_cores": round(cpu / wall, 2),
        "samples_per_controller_cpu_s": round(samples / cpu) if cpu else None,
        "postgres_cores": round(pg_cpu / wall, 2) if pg_cpu is not None else None,
        "samples_per_postgres_cpu_s": round(samples / pg_cpu) if pg_cpu else None,
        "rss_empty_mib": round(rss0 / 2**20, 1),
        "rss_loaded_mib": round(rss1 / 2**20, 1),
        "rss_per_node_kib": round((rss1 - rss0) / a.nodes / 1024, 1),
        "api_ms": {
            p.replace("/api/v1", ""): {
                "n": len(v),
                "p50": round(pct(v, 50), 1),
                "p99": round(pct(v, 99), 1),
            }
            for p, v in polled.items()
        },
        "loops": ticks,
    }


def extrapolate(r: dict[str, Any]) -> dict[str, Any]:
    """EXTRAPOLATED to 10,000 nodes, linearly from the measured per-CPU-second figures."""
    target = TARGET_NODES * GPUS  # one sample per GPU per second
    ctl = target / r["samples_per_controller_cpu_s"] if r["samples_per_controller_cpu_s"] else None
    pg = target / r["samples_per_postgres_cpu_s"] if r["samples_per_postgres_cpu_s"] else None
    scale = TARGET_NODES / r["nodes"]
    return {
        "samples_per_s": target,
        "batches_per_s": TARGET_NODES / PUSH_S,
        "controller_cores": round(ctl, 1) if ctl else None,
        # one writer thread and the GIL: a controller process uses about one core at most
        "controller_processes": math.ceil(ctl) if ctl else None,
        "postgres_cores": round(pg, 1) if pg else None,
        "controller_rss_gib": round(r["rss_per_node_kib"] * TARGET_NODES / 2**20, 2),
        "lifecycle_tick_ms": round(r["loops"]["lifecycle_ms"] * scale, 1),
        "breaker_ms": round(r["loops"]["breaker_ms"] * scale, 2),
    }


def report(r: dict[str, Any], as_json: bool) -> None:
    r["extrapolated_10000_nodes"] = extrapolate(r)
    if as_json:
        print(json.dumps(r, indent=2))
        return
    ld, lp, x = r["load"], r["loops"], r["extrapolated_10000_nodes"]
    print(
        f"{r['nodes']} nodes x {GPUS} GPUs on PostgreSQL, {r['replicas']} controller(s), "
        f"{r['cpus']} CPUs, load average {r['load_average']}"
    )
    reg = r["registration"]
    print(
        f"  registration: {reg['s']} s ({reg['ms_per_node']} ms per node, {reg['errors']} errors)"
    )
    print(
        f"  offered {r['offered_samples_per_s']:,.0f} GPU samples/s "
        f"({r['offered_batches_per_s']:.0f} batches/s); acknowledged {r['samples_per_s']:,} /s, "
        f"max lag {ld['max_lag_s']} s, "
        f"ack p50 {ld['ack_p50_ms']} ms p99 {ld['ack_p99_ms']} ms, "
        f"{ld['errors']} errors, {ld['throttled']} throttled"
    )
    print(
        f"  controller {r['controller_cores']} cores: {r['samples_per_controller_cpu_s']:,} "
        f"samples per controller CPU-second; PostgreSQL {r['postgres_cores']} cores "
        f"({r['samples_per_postgres_cpu_s']} samples per CPU-second)"
    )
    print(
        f"  controller RSS {r['rss_empty_mib']} MiB empty, {r['rss_loaded_mib']} MiB loaded: "
        f"{r['rss_per_node_kib']} KiB per node"
    )
    for path, v in r["api_ms"].items():
        print(f"  API {path}: p50 {v['p50']} ms, p99 {v['p99']} ms ({v['n']} calls)")
    print(
        f"  loops per tick: lifecycle {lp['lifecycle_ms']} ms (first {lp['lifecycle_first_ms']}), "
        f"breaker {lp['breaker_ms']} ms, campaigns {lp['campaigns_ms']} ms, "
        f"whole tick {lp['tick_ms']} ms; cache load {lp['cache_load_ms']} ms"
    )
    print(
        f"  EXTRAPOLATED to {TARGET_NODES:,} nodes ({x['samples_per_s']:,} samples/s, "
        f"{x['batches_per_s']:.0f} batches/s), linear in the measured figures: controller "
        f"~{x['controller_cores']} cores, so at least {x['controller_processes']} controller "
        f"processes (replicas, each ~1 core at most), PostgreSQL ~{x['postgres_cores']} cores, "
        f"controller RSS ~{x['controller_rss_gib']} GiB, "
        f"lifecycle tick ~{x['lifecycle_tick_ms']} ms"
    )


if __name__ == "__main__":
    main()
