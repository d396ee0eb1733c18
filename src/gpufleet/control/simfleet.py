"""Simulated agents pushing to a control plane: one `NodePusher` per node turns a `GpuBackend`
(the simulator or real NVML) into wire batches, and `run_fleet` pushes many of them over HTTP
from one process (`gpufleet sim-fleet`, `gpufleet up`, the ingest benchmark).

A light agent for many simulated nodes in one process: devices on the first batch, columnar
samples, XID/lost events, a sequence number per batch, and replay of what was not acknowledged.
Findings come from the agent's own health rules (`gpufleet.health.HealthTracker`, evaluated at
most every ``health_interval_s`` and at once on events), so `gpufleet up` shows the same
findings and actions a real `gpufleet agent` would send; ``health=False`` skips them for pure
load generation.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.control.httpclient import Pool
from gpufleet.control.telemetry_store import FIELDS as TELEMETRY_FIELDS
from gpufleet.devices.backend import GpuBackend
from gpufleet.errors import DeviceError, GpuLostError

# What the controller keeps in memory, plus counters it stores with the batch.
SAMPLE_FIELDS = (
    *TELEMETRY_FIELDS,
    "ecc_sbe_volatile",
    "energy_mj",
    "remapped_rows_uncorrectable",
    "pcie_replay_count",
)
MAX_UNACKED = 10_000  # batches kept for replay per node (oldest dropped first)


@dataclass
class NodePusher:
    """One simulated agent: samples its backend and produces wire batches (JSON bytes)."""

    backend: GpuBackend
    clock: Callable[[], float] = time.time
    agent_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    heartbeat_interval_s: float = 2.0
    seq: int = 0
    sent_devices: bool = False
    _t: dict[int, list[float]] = field(default_factory=dict)
    _f: dict[int, dict[str, list[Any]]] = field(default_factory=dict)
    _events: list[dict[str, Any]] = field(default_factory=list)
    _findings: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    unacked: deque[tuple[int, bytes]] = field(default_factory=deque)
    jobs: Any = None  # a gpufleet.agent.jobs.AgentJobs when this node runs jobs (issue 7)
    health: bool = True
    health_interval_s: float = 2.0
    _health: Any = None  # SimHealth, made on first use

    @property
    def node(self) -> str:
        return self.backend.node_name

    def sample(self) -> int:
        """Read every GPU once; returns how many GPUs answered."""
        now = self.clock()
        ok = 0
        for i in range(self.backend.device_count()):
            try:
                sample = self.backend.sample(i)
                s = asdict(sample)
            except GpuLostError:
                self._lost(i, now)
                continue
            except DeviceError:
                continue
            ok += 1
            self._t.setdefault(i, []).append(now)
            cols = self._f.setdefault(i, {f: [] for f in SAMPLE_FIELDS})
            for f in SAMPLE_FIELDS:
                v = s.get(f)
                cols[f].append(None if v is None else float(v))
            if self.health:
                self._health_state().observe(i, sample)
        events = self.backend.poll_events(0)
        for ev in events:
            self._events.append(
                {
                    "gpu_index": ev.gpu_index,
                    "gpu_uuid": ev.gpu_uuid,
                    "kind": ev.kind,
                    "timestamp_s": ev.timestamp_s,
                    "xid": ev.xid,
                    "detail": ev.detail,
                }
            )
        if self.health:
            h = self._health_state()
            h.observe_events(events)
            findings = h.evaluate(now, self.backend, urgent=bool(events))
            if findings is not None:
                self._findings = {(f["code"], f["component"]): f for f in findings}
        return ok

    def _health_state(self) -> Any:
        if self._health is None:
            from gpufleet.control.sim_health import SimHealth

            self._health = SimHealth(self.node, clock=self.clock, interval_s=self.health_interval_s)
        return self._health

    def _uuid(self, i: int) -> str:
        try:
            return self.backend.device_info(i).uuid
        except DeviceError:
            return f"{self.node}-gpu{i}"

    def _lost(self, i: int, now: float) -> None:
        if self.health:
            self._health_state().observe_lost(i)
        else:
            self._finding(i, "GPU_LOST", 2, "GPU has fallen off the bus", "reboot_node", now)

    def _finding(self, i: int, code: str, sev: int, msg: str, action: str, now: float) -> None:
        comp = self._uuids.get(i) if hasattr(self, "_uuids") else None
        comp = comp or f"gpu{i}"
        key = (code, comp)
        if key in self._findings:
            self._findings[key]["last_seen_s"] = now
            return
        self._findings[key] = {
            "rule": "sim",
            "code": code,
            "severity": sev,
            "component": comp,
            "message": msg,
            "action": action,
            "sticky": True,
            "gpu_index": i,
            "first_seen_s": now,
            "last_seen_s": now,
        }

    def devices(self) -> list[dict[str, Any]]:
        out = []
        self._uuids: dict[int, str] = {}
        for i in range(self.backend.device_count()):
            try:
                info = asdict(self.backend.device_info(i))
            except DeviceError:
                continue
            self._uuids[i] = info["uuid"]
            out.append({"index": i, "uuid": info["uuid"], "info": info})
        return out

    def make_batch(self) -> tuple[int, bytes]:
        """Everything sampled since the last batch, as one wire batch; kept until acked."""
        if not self.sent_devices:
            devs: list[dict[str, Any]] | None = self.devices()
            self.sent_devices = True
        else:
            devs = None
        uuids = getattr(self, "_uuids", {})
        samples = [
            {"gpu_uuid": uuids.get(i, f"gpu{i}"), "gpu_index": i, "t": ts, "fields": self._f[i]}
            for i, ts in self._t.items()
        ]
        worst = max((f["severity"] for f in self._findings.values()), default=0)
        self.seq += 1
        body: dict[str, Any] = {
            "schema_version": 1,
            "node": self.node,
            "agent_id": self.agent_id,
            "seq": self.seq,
            "sent_at_s": self.clock(),
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "samples": samples,
            "findings": list(self._findings.values()),
            "events": self._events,
            "health": worst,
        }
        if devs is not None:
            body["devices"] = devs
        if self.jobs is not None:
            body["jobs"] = self.jobs.report().model_dump(mode="json")
        self._t, self._f, self._events = {}, {}, []
        raw = json.dumps(body, separators=(",", ":")).encode()
        self.unacked.append((self.seq, raw))
        while len(self.unacked) > MAX_UNACKED:
            self.unacked.popleft()
        return self.seq, raw

    def acked(self, seq: int) -> None:
        self.unacked = deque((s, b) for s, b in self.unacked if s != seq)

    def on_ack(self, body: bytes) -> None:
        """Apply what an ``Ack`` carries: acknowledgements of findings made on the control plane
        (to this agent's health tracker; the finding leaves the next batch) and, when this node
        runs jobs, the commands (jobs to start/kill)."""
        if self.jobs is None and (not self.health or b'"acks"' not in body):
            return  # the common case, kept cheap: nothing to do
        from gpufleet.wire import Ack

        ack = Ack.model_validate_json(body)
        if ack.acks and self.health:
            for key in self._health_state().acknowledge(ack.acks):
                self._findings.pop(key, None)
        if self.jobs is not None:
            self.jobs.apply(ack.commands)


@dataclass
class PushStats:
    """What a pushing run achieved."""

    batches: int = 0
    samples: int = 0
    errors: int = 0
    throttled: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def percentile(self, p: float) -> float | None:
        if not self.latencies_ms:
            return None
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, round(p / 100.0 * (len(xs) - 1)))]


async def push_one(
    pool: Pool,
    token: str,
    raw: bytes,
    gz: bool,
    stats: PushStats,
    n_samples: int,
    on_ack: Callable[[bytes], None] | None = None,
) -> bool:
    """POST one batch; True when acknowledged."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = raw
    if gz:
        body = gzip.compress(raw, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    t0 = time.perf_counter()
    try:
        r = await pool.request("POST", "/api/v1/ingest", body, headers)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        stats.errors += 1
        return False
    if r.status == 200:
        stats.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        stats.batches += 1
        stats.samples += n_samples
        if on_ack is not None:
            on_ack(r.body)
        return True
    if r.status == 429:
        stats.throttled += 1
    else:
        stats.errors += 1
    return False


async def run_fleet(
    controller: str,
    token: str,
    pushers: list[NodePusher],
    *,
    duration_s: float | None,
    sample_interval_s: float = 1.0,
    push_interval_s: float = 2.0,
    concurrency: int = 64,
    gzip_body: bool = True,
    stop: asyncio.Event | None = None,
    on_round: Callable[[PushStats], None] | None = None,
) -> PushStats:
    """Sample every node each ``sample_interval_s``; push each node's batch (and any
    unacknowledged ones, oldest first) every ``push_interval_s``."""
    stats = PushStats()
    pool = Pool(controller, concurrency)
    start = time.monotonic()
    next_push = start
    try:

        async def push_node(p: NodePusher) -> None:
            for seq, raw in list(p.unacked):
                if await push_one(pool, token, raw, gzip_body, stats, _count(raw), p.on_ack):
                    p.acked(seq)
                else:
                    return  # keep order: retry the rest next round

        while duration_s is None or time.monotonic() - start < duration_s:
            round_start = time.monotonic()
            if stop is not None and stop.is_set():
                break
            for p in pushers:
                p.sample()
            if time.monotonic() >= next_push:
                next_push += push_interval_s
                for p in pushers:
                    p.make_batch()
                await asyncio.gather(*(push_node(p) for p in pushers))
                if on_round is not None:
                    on_round(stats)
            await asyncio.sleep(max(0.0, sample_interval_s - (time.monotonic() - round_start)))
    finally:
        pool.close()
    return stats


def _count(raw: bytes) -> int:
    """Samples in a batch (timestamps across GPUs), from its JSON."""
    body = json.loads(raw)
    return sum(len(s["t"]) for s in body.get("samples", []))
