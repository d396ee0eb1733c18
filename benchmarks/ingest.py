"""Ingest benchmark: maximum sustained GPU samples per second into a real controller (uvicorn on
loopback, SQLite in WAL mode with synchronous=FULL, in a temporary data directory), with p50/p99
acknowledgement latency, against the 25,000 samples/s floor of issue 6.

Load: the real agent (`gpufleet.agent.runner.Agent`, what `gpufleet agent` and `gpufleet
sim-fleet` run) samples the simulated fleet for real and builds each node's batches (NODES x
GPUS x SAMPLES readings per batch, the first with its slow-tier fields too); the
timed phase then pushes those payloads with fresh sequence numbers from a closed loop of
CONCURRENCY keep-alive connections (a minimal HTTP/1.1 client over asyncio streams, far
cheaper per request than httpx), so neither the simulator's physics nor the client is what is
measured. The controller runs in a separate process (one
uvicorn worker).

    python benchmarks/ingest.py [--nodes 200] [--samples 10] [--duration 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

FLOOR = 25_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render_pool(nodes: int, gpus: int, samples: int) -> list[tuple[str, str, dict[str, Any]]]:
    """One batch body template per node, sampled from the simulator by the real agent."""
    from gpufleet.agent.runner import Agent, AgentConfig
    from gpufleet.devices.sim import ManualClock, SimFleet
    from gpufleet.devices.sim.spec import parse_short_spec

    # sampled "now": the controller keeps samples from its own recent past only (docs/security.md)
    clock = ManualClock(time.time() - samples - 1.0)
    fleet = SimFleet(parse_short_spec(f"{nodes}x{gpus}xh100-sxm", prefix="bench"), clock=clock)
    fleet.demo_activity()
    pool = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-agents-") as tmp:
        # sample a few distinct nodes for real, reuse their columns for the rest (same shape)
        real = [
            Agent(
                b,
                AgentConfig(controller="http://unused", state_dir=Path(tmp) / b.node_name),
                clock=clock,
            )
            for b in fleet.backends()[: min(nodes, 8)]
        ]
        for _ in range(samples):
            for a in real:
                a.tick(clock())
            clock.advance(1.0)
        templates = [a.build_batch(1).model_dump(mode="json") for a in real]
        for a in real:
            a.close()
    for i, spec in enumerate(fleet.spec.nodes):
        body = dict(templates[i % len(templates)])
        body["node"] = spec.name
        body["agent_id"] = f"bench-{i}"
        pool.append((spec.name, f"bench-{i}", body))
    return pool


class Connection:
    """One HTTP/1.1 keep-alive connection over asyncio streams (plain http, Content-Length
    answers), one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST ``body``; (status, response body). Reconnects once when the server closed."""
        for attempt in (0, 1):
            if self._w is None:
                self._r, self._w = await asyncio.open_connection(self.host, self.port)
            try:
                return await self._once(path, body, headers)
            except (ConnectionError, asyncio.IncompleteReadError):
                self._w.close()
                self._r = self._w = None
                if attempt == 1:
                    raise
        raise ConnectionError("unreachable")

    async def _once(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        assert self._r is not None and self._w is not None
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        head += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
        self._w.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await self._w.drain()
        status_line, *lines = (await self._r.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        payload = await self._r.readexactly(int(hdrs.get("content-length") or 0))
        if hdrs.get("connection", "").lower() == "close":
            self._w.close()
            self._r = self._w = None
        return int(status_line.split(" ", 2)[1]), payload


async def blast(
    url: str,
    token: str,
    pool: list[tuple[str, str, dict[str, Any]]],
    duration: float,
    concurrency: int,
    gz: bool,
) -> dict[str, Any]:
    seqs = {agent: 0 for _, agent, _ in pool}
    # GPU samples per batch: readings of one GPU at one time (a slow-tier row taken with a
    # fast one is the same sample)
    per_batch = len({(s["gpu_index"], t) for s in pool[0][2]["samples"] for t in s["t"]})
    lat: list[float] = []
    acked = throttled = errors = 0
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    # pre-encode: the body differs only by seq; splice it in as text
    encoded = []  # (agent, first batch with devices, later batches without)
    for _, agent, body in pool:
        b = dict(body, seq=0)
        first = json.dumps(b, separators=(",", ":"))
        b.pop("devices", None)
        encoded.append((agent, first, json.dumps(b, separators=(",", ":"))))
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    stop_at = time.monotonic() + duration
    warm_until = time.monotonic() + min(3.0, duration / 4)
    counted = 0
    t_start = None
    if True:

        async def worker(k: int) -> None:
            client = Connection(host, int(port))
            nonlocal acked, throttled, errors, counted, t_start
            i = k
            while time.monotonic() < stop_at:
                agent, first, later = encoded[i % len(encoded)]
                i += concurrency
                seqs[agent] += 1
                text = first if seqs[agent] == 1 else later
                raw = text.replace('"seq":0', f'"seq":{seqs[agent]}', 1).encode()
                body = gzip.compress(raw, 1) if gz else raw
                t0 = time.perf_counter()
                status, _ = await client.request("/api/v1/ingest", body, headers)
                dt = (time.perf_counter() - t0) * 1000.0
                if status == 200:
                    acked += 1
                    if time.monotonic() >= warm_until:
                        if t_start is None:
                            t_start = time.monotonic()
                        counted += 1
                        lat.append(dt)
                elif status == 429:
                    throttled += 1
                    await asyncio.sleep(1.0)
                else:
                    errors += 1

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    elapsed = time.monotonic() - (t_start or time.monotonic())
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))] if lat else float("nan")

    rate = counted * per_batch / elapsed if elapsed > 0 else 0.0
    return {
        "samples_per_batch": per_batch,
        "batches_acked": acked,
        "throttled": throttled,
        "errors": errors,
        "measured_s": round(elapsed, 2),
        "samples_per_s": round(rate),
        "batches_per_s": round(counted / elapsed, 1),
        "p50_ms": round(pct(50), 2),
        "p99_ms": round(pct(99), 2),
        "ratio_to_floor": round(rate / FLOOR, 2),
    }


UNLIMITED = ["--max-nodes-per-token", "0"]


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (0 elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def start_controller(data_dir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`gpufleet controller` in its own process on a free port, once it answers: (process,
    base URL, an agent token)."""
    exe = [sys.executable, "-m", "gpufleet"]
    out = subprocess.run(
        [*exe, "token", "create", "--role", "agent", "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    port = free_port()
    server = subprocess.Popen(
        # one bootstrap token stands in for a whole simulated fleet: no nodes-per-token limit
        [*exe, "controller", "--data-dir", str(data_dir), "--port", str(port), *UNLIMITED],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/api/v1/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return server, base, json.loads(out.stdout)["token"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--samples", type=int, default=10, help="samples per GPU per batch")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    server, base, token = start_controller(Path(tempfile.mkdtemp(prefix="gpufleet-bench-")))
    try:
        pool = render_pool(args.nodes, args.gpus, args.samples)
        cpu0, wall0 = process_cpu_s(server.pid), time.monotonic()
        res = asyncio.run(
            blast(f"{base}/api/v1/ingest", token, pool, args.duration, args.concurrency, args.gzip)
        )
        cpu = process_cpu_s(server.pid) - cpu0
        # the controller's CPU (all its threads) over the whole blast, warm-up included: a
        # figure less at the mercy of other load on the machine than the rate itself
        res["controller_cores"] = round(cpu / (time.monotonic() - wall0), 2)
        res["controller_cpu_ms_per_batch"] = round(cpu * 1000 / max(1, res["batches_acked"]), 3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    res.update(
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        concurrency=args.concurrency,
        gzip=args.gzip,
        cpus=os.cpu_count(),
        load_average=round(os.getloadavg()[0], 2),
    )
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(
            f"ingest: {res['samples_per_s']:,} GPU samples/s sustained "
            f"({res['batches_per_s']} batches/s of {res['samples_per_batch']} samples), "
            f"p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms; "
            f"{res['ratio_to_floor']}x the 25,000/s floor "
            f"[{args.nodes} nodes x {args.gpus} GPUs, {args.concurrency} connections, "
            f"{res['throttled']} throttled, {res['errors']} errors, {res['cpus']} CPUs]; "
            f"controller {res['controller_cpu_ms_per_batch']} ms CPU per batch "
            f"({res['controller_cores']} cores), load average {res['load_average']}"
        )


if __name__ == "__main__":
    main()
