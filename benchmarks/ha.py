"""High availability benchmark (issue 18): leader failover time over repeated ``kill -9`` of the
leader, and ingest into one and into two controller replicas on one PostgreSQL, per core.

Failover: two ``gpufleet controller`` processes (``--db-url``, ``--lease-seconds``,
``--renew-seconds``: by default the shipped 6 s and 2 s) on a private PostgreSQL (Debian's
``postgresql``, started here unless ``--db-url`` is given); ``--kills`` times the leader is
``kill -9``-ed and the time until the other answers ``role: leader`` on ``/api/v1/health`` is
taken (polled every 20 ms); the killed one is started again as a follower. Expected: at most
lease + renew (plus a poll); the issue's bound is 10 s.

Ingest: the same closed-loop load as ``benchmarks/ingest.py`` (real agent batches, one bootstrap
token for the fleet, keep-alive connections), first into one replica (the baseline), then with
the nodes split over two replicas, each replica's CPU read from /proc. Printed: samples/s, the
replicas' cores used, samples per core-second, and the two-replica figures as ratios to the
one-replica baseline of the same run (this machine's load moves absolute figures; the ratios
less); ``--rounds`` alternates the two and keeps each one's best. On a machine with few cores
the two replicas and the load generator share them: the per-core figure is the one that says
whether a second replica adds capacity.

    python benchmarks/ha.py [--kills 20] [--lease 6] [--renew 2] [--duration 15] [--rounds 2]
                            [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import blast, process_cpu_s, render_pool  # type: ignore[import-not-found]

from gpufleet.testing.pgserver import private_postgres
from gpufleet.testing.procs import ControllerProcess, create_tokens


def role(ctl: ControllerProcess) -> str | None:
    try:
        r = httpx.get(ctl.url + "/api/v1/health", timeout=0.5)
        return str(r.json().get("role")) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))] if v else float("nan")


def reset(url: str) -> None:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE"))
        c.execute(text("CREATE SCHEMA public"))
    eng.dispose()


@contextmanager
def replicas(url: str, n: int, args: list[str], tmp: Path) -> Iterator[list[ControllerProcess]]:
    """``n`` controllers on ``url`` (a fresh schema), started; stopped at the end."""
    reset(url)
    admin = create_tokens(None, {"admin": ("admin", None)}, db_url=url)["admin"]
    ctls = [
        ControllerProcess(tmp / f"r{i}-{time.monotonic_ns()}", admin, db_url=url, args=args)
        for i in range(n)
    ]
    try:
        for c in ctls:
            c.start()
        yield ctls
    finally:
        for c in ctls:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGCONT)
            c.stop()


def leader_of(ctls: list[ControllerProcess], timeout_s: float = 60.0) -> ControllerProcess:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leading = [c for c in ctls if role(c) == "leader"]
        if len(leading) == 1:
            return leading[0]
        time.sleep(0.02)
    raise TimeoutError("no single leader")


def failover(url: str, kills: int, lease: float, renew: float, tmp: Path) -> dict[str, Any]:
    args = ["--lease-seconds", f"{lease:g}", "--renew-seconds", f"{renew:g}", "--scheduler", "none"]
    times: list[float] = []
    with replicas(url, 2, args, tmp) as ctls:
        for _ in range(kills):
            leader = leader_of(ctls)
            other = next(c for c in ctls if c is not leader)
            time.sleep(renew)  # the follower has tried the lease at least once since
            t0 = time.monotonic()
            leader.kill9()
            while role(other) != "leader":
                if time.monotonic() - t0 > 120:
                    raise TimeoutError("no new leader within 120 s")
                time.sleep(0.02)
            times.append(time.monotonic() - t0)
            leader.start()
    return {
        "kills": kills,
        "lease_s": lease,
        "renew_s": renew,
        "p50_s": round(pct(times, 50), 2),
        "p99_s": round(pct(times, 99), 2),
        "max_s": round(max(times), 2),
        "bound_s": lease + renew,
    }


def ingest(
    url: str, n: int, pool: list[Any], duration: float, conc: int, tmp: Path
) -> dict[str, Any]:
    args = ["--max-nodes-per-token", "0", "--scheduler", "none"]
    with replicas(url, n, args, tmp) as ctls:
        token = create_tokens(None, {"agent": ("agent", None)}, db_url=url)["agent"]
        parts = [pool[i::n] for i in range(n)]  # each node pushes to one replica
        pids = [c.proc.pid for c in ctls if c.proc is not None]
        cpu0 = [process_cpu_s(p) for p in pids]
        t0 = time.monotonic()

        async def all_of() -> list[dict[str, Any]]:
            return list(
                await asyncio.gather(
                    *(
                        blast(c.url + "/api/v1/ingest", token, part, duration, conc // n, False)
                        for c, part in zip(ctls, parts, strict=True)
                    )
                )
            )

        results = asyncio.run(all_of())
        wall = time.monotonic() - t0
        cores = sum(process_cpu_s(p) - c0 for p, c0 in zip(pids, cpu0, strict=True)) / wall
    rate = sum(r["samples_per_s"] for r in results)
    return {
        "replicas": n,
        "samples_per_s": round(rate),
        "controller_cores": round(cores, 2),
        "samples_per_core_s": round(rate / cores) if cores else None,
        "p99_ms": max(r["p99_ms"] for r in results),
        "errors": sum(r["errors"] for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--db-url", help="an empty PostgreSQL database (default: a private server)")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--lease", type=float, default=6.0)
    ap.add_argument("--renew", type=float, default=2.0)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--samples", type=int, default=5, help="samples per GPU per batch")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="ingest rounds (1, 2 replicas each)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ha-"))
    ctx = nullcontext(a.db_url) if a.db_url else private_postgres()
    with ctx as url:
        res: dict[str, Any] = {}
        if a.kills:
            res["failover"] = failover(url, a.kills, a.lease, a.renew, tmp)
        if a.duration > 0:
            pool = render_pool(a.nodes, a.gpus, a.samples)
            runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
            for _ in range(a.rounds):  # alternated, so drifting load hits both alike
                for n in (1, 2):
                    runs[n].append(ingest(url, n, pool, a.duration, a.concurrency, tmp))
            one, two = (max(runs[n], key=lambda r: r["samples_per_s"]) for n in (1, 2))
            res["ingest"] = {
                "one_replica": one,
                "two_replicas": two,
                "rate_ratio": round(two["samples_per_s"] / max(1, one["samples_per_s"]), 2),
                "per_core_ratio": round(
                    (two["samples_per_core_s"] or 0) / max(1, one["samples_per_core_s"] or 1), 2
                ),
            }
    res["cpus"] = os.cpu_count()
    res["load_average"] = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    if "failover" in res:
        f = res["failover"]
        print(
            f"failover over {f['kills']} kill -9 of the leader (lease {f['lease_s']:g} s, renew "
            f"{f['renew_s']:g} s): p50 {f['p50_s']} s, p99 {f['p99_s']} s, max {f['max_s']} s "
            f"(bound lease + renew = {f['bound_s']:g} s)"
        )
    if "ingest" in res:
        g = res["ingest"]
        for k in ("one_replica", "two_replicas"):
            r = g[k]
            print(
                f"ingest, {r['replicas']} replica(s): {r['samples_per_s']:,} GPU samples/s, "
                f"{r['controller_cores']} controller cores, {r['samples_per_core_s']:,} samples "
                f"per core-second, p99 {r['p99_ms']} ms, {r['errors']} errors"
            )
        print(
            f"two replicas vs one (same run): {g['rate_ratio']}x the rate, "
            f"{g['per_core_ratio']}x per core [{res['cpus']} CPUs, load {res['load_average']}]"
        )


if __name__ == "__main__":
    main()
