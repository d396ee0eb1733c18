"""A large fleet in a controller quickly, for the scale benchmarks and the 10,000-node browser
test: synthetic wire batches (schema v1, 8 x H100 SXM per node) committed through the real
ingest path (`parse_batch`, `queue_item`, the writer's group commit), many batches per
transaction, and racks set for every node in one transaction.

Going through `gpufleet.control.ingest.writes.apply_batches` in groups is what the writer does with
concurrent pushes; one batch per request (the HTTP path) would take minutes for 10,000 registrations
on a small machine, which is the benchmark's subject, not its setup.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select, update

from gpufleet.control.db.models import Gpu, Node, Rack
from gpufleet.control.ingest.queue import parse_batch, queue_item
from gpufleet.control.ingest.writes import apply_batches
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.store import ControlStore

GPUS = 8
# H100 SXM board power limit 700 W (NVIDIA H100 Tensor Core GPU datasheet)
POWER_LIMIT_W = 700.0


def node_batch(
    name: str,
    rng: random.Random,
    now: float,
    *,
    fail: bool = False,
    seq: int = 1,
    samples: int = 2,
    devices: bool = True,
) -> dict[str, Any]:
    """One wire batch for an 8 x H100 SXM node: ``samples`` 1 Hz samples per GPU ending at
    ``now``, seeded figures (70 % of nodes busy), an XID 79 fail finding when ``fail``."""
    busy = rng.random() < 0.7
    blocks = []
    devs = []
    ts = [now - (samples - 1 - k) for k in range(samples)]
    for g in range(GPUS):
        util = rng.uniform(85, 100) if busy else rng.uniform(0, 5)
        power = POWER_LIMIT_W * (0.9 + 0.1 * rng.random()) if busy else rng.uniform(70, 90)
        temp = rng.uniform(55, 80) if busy else rng.uniform(30, 40)
        uuid = f"GPU-{name}-{g}"
        blocks.append(
            {
                "gpu_uuid": uuid,
                "gpu_index": g,
                "t": ts,
                "fields": {
                    "gpu_util_pct": [util] * samples,
                    "power_w": [power] * samples,
                    "gpu_temp_c": [temp] * samples,
                    "sm_clock_mhz": [1755.0 if busy else 345.0] * samples,
                },
            }
        )
        devs.append(
            {
                "index": g,
                "uuid": uuid,
                "info": {
                    "model": "h100-sxm",
                    "name": "NVIDIA H100 80GB HBM3",
                    "power_limit_enforced_w": POWER_LIMIT_W,
                },
            }
        )
    findings = []
    if fail:
        findings.append(
            {
                "rule": "xid",
                "code": "XID_79",
                "severity": 2,
                "component": f"GPU-{name}-0",
                "message": "GPU has fallen off the bus",
                "action": "drain_and_inspect",
                "sticky": True,
                "gpu_index": 0,
            }
        )
    body: dict[str, Any] = {
        "schema_version": 1,
        "node": name,
        "agent_id": f"bench-{name}",
        "seq": seq,
        "sent_at_s": now,
        "heartbeat_interval_s": 2.0,
        "health": 2 if fail else 0,
        "samples": blocks,
        "findings": findings,
    }
    if devices:
        body["devices"] = devs
    return body


def fill(
    store: ControlStore,
    names: Sequence[str],
    now: float,
    *,
    fail_every: int = 100,
    group: int = 250,
    seed: int = 7,
    devices: bool = True,
) -> None:
    """One batch for each of ``names`` (every ``fail_every``-th node, from the 8th on, with a
    fail finding), ``group`` batches per transaction, through the writer; with ``devices`` the
    batches carry the device list (an agent's first batch: it registers unknown nodes)."""
    rng = random.Random(seed)
    agent = Principal(None, "bench", Role.AGENT)
    items = []
    for i, n in enumerate(names):
        fail = fail_every > 0 and i % fail_every == 7
        parsed = parse_batch(
            json.dumps(node_batch(n, rng, now, fail=fail, devices=devices)).encode(), now
        )
        items.append(queue_item(parsed, agent, now))
    for k in range(0, len(items), group):
        chunk = items[k : k + group]
        store.writer.call(lambda chunk=chunk: apply_batches(store, chunk))  # type: ignore[misc]


def set_racks(store: ControlStore, racks: dict[str, str]) -> None:
    """Put each node of ``racks`` (node -> rack name) in its rack, in one transaction (test
    setup: `PATCH /nodes/{name}` does the same one node at a time, with an audit row)."""

    def write() -> None:
        with store.sessions.begin() as s:
            ids = {r.name: r.id for r in s.scalars(select(Rack))}
            for name in sorted(set(racks.values()) - set(ids)):
                r = Rack(name=name)
                s.add(r)
                s.flush()
                ids[name] = r.id
            by_rack: dict[str, list[int]] = {}
            for node, rack in racks.items():
                by_rack.setdefault(rack, []).append(store.nodes[node].id)
            for rack, node_ids in by_rack.items():
                s.execute(update(Node).where(Node.id.in_(node_ids)).values(rack_id=ids[rack]))
        for node, rack in racks.items():
            store.nodes[node].rack = rack
            store.dirty(node)
        store.bump()

    store.writer.call(write)


def register(store: ControlStore, names: Sequence[str], now: float, racks_of: int = 16) -> None:
    """Put ``names`` in the database as registered, validated nodes in service (8 GPUs each,
    racks of ``racks_of`` nodes named r000, r001, ...) with bulk inserts, then reload the
    controller's cache: the setup of a 10,000-node test in seconds, where registering through
    ingest (one ORM row per GPU, a lifecycle transition per step) takes about a minute here.
    Telemetry then goes through the real ingest path (`fill` with ``devices=False``)."""

    def write() -> None:
        with store.sessions.begin() as s:
            rack_names = sorted({f"r{i // racks_of:03d}" for i in range(len(names))})
            s.execute(insert(Rack), [{"name": r} for r in rack_names])
            rack_ids = {r.name: r.id for r in s.scalars(select(Rack))}
            s.execute(
                insert(Node),
                [
                    {
                        "name": n,
                        "rack_id": rack_ids[f"r{i // racks_of:03d}"],
                        "state": "in_service",
                        "state_since_s": now,
                        "state_reason": "registered in bulk (test setup)",
                        "cordoned": False,
                        "health": 0,
                        "agent_id": f"bench-{n}",
                        "heartbeat_interval_s": 2.0,
                        "last_seen_s": now,
                        "registered_s": now,
                        "labels": {},
                    }
                    for i, n in enumerate(names)
                ],
            )
            ids = {n: i for n, i in s.execute(select(Node.name, Node.id))}
            info = {
                "model": "h100-sxm",
                "name": "NVIDIA H100 80GB HBM3",
                "power_limit_enforced_w": POWER_LIMIT_W,
            }
            s.execute(
                insert(Gpu),
                [
                    {
                        "node_id": ids[n],
                        "index": g,
                        "uuid": f"GPU-{n}-{g}",
                        "name": info["name"],
                        "model": "h100-sxm",
                        "info": {**info, "index": g, "uuid": f"GPU-{n}-{g}"},
                        "updated_s": now,
                    }
                    for n in names
                    for g in range(GPUS)
                ],
            )
        store.load()
        store.bump()

    store.writer.call(write)
