"""`kill -9` of a real controller process while closed minutes and their late samples come in
(issue 29): after each restart every closed minute is in the rollups the API serves, with the
count, min, mean and max of exactly the samples acknowledged for it, whatever process wrote it;
only the minute still open may be missing.

Sample times are in the recent past (the rings file a sample under the minute of its own
time; a minute is closed once the clock has passed its end), so no test waits for a real
minute to pass: minutes ``now - 3`` to ``now - 1`` are closed when their samples arrive, the
newest of them always inside the 90 s the old controller held a minute in memory before
writing it, and ``now`` is the open one."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.control.db.engine import database_url, make_engine, migrate
from gpufleet.control.series import rollups
from gpufleet.control.state.store import ControlStore
from tests.control.conftest import free_port
from tests.integration.processes import start
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process]

GPUS = 2
STEP_S = 2  # one sample every 2 s
BATCH_S = 10  # an agent's push: the samples of 10 s
FIELDS = ("gpu_util_pct", "power_w")
Key = tuple[int, int]  # (gpu, minute_s)


def value(field: str, t: int, gpu: int) -> float:
    """The reading a GPU sends at second ``t``: integers, so sums and means are exact."""
    if field == "gpu_util_pct":
        return float((t * 7 + gpu * 13) % 101)
    return float(100 + (t % 17) * 10 + gpu)


class Fleet:
    """One node's agent pushing batches over HTTP, and what the test expects the rollups to
    hold: every acknowledged, not duplicate sample, by (gpu, minute) and field."""

    def __init__(self, agent_token: str, viewer_token: str) -> None:
        self.agent = {"Authorization": f"Bearer {agent_token}"}
        self.viewer = {"Authorization": f"Bearer {viewer_token}"}
        self.url = ""
        self.seq = 0
        self.sent: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def body(self, seq: int, times: list[int]) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "node": "n1",
            "agent_id": "agent-n1",
            "seq": seq,
            "sent_at_s": time.time(),
            "heartbeat_interval_s": 2.0,
            "health": 0,
            "samples": [
                {
                    "gpu_uuid": f"GPU-n1-{g}",
                    "gpu_index": g,
                    "t": [float(t) for t in times],
                    "fields": {f: [value(f, t, g) for t in times] for f in FIELDS},
                }
                for g in range(GPUS)
            ],
            "findings": [],
            "devices": [
                {
                    "index": g,
                    "uuid": f"GPU-n1-{g}",
                    "info": {"model": "h100-sxm", "name": "NVIDIA H100"},
                }
                for g in range(GPUS)
            ],
        }

    def push(self, times: list[int], seq: int | None = None) -> bool:
        """Push one batch (a new seq unless ``seq`` replays one); whether it was new."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        r = httpx.post(
            f"{self.url}/api/v1/ingest", json=self.body(seq, times), headers=self.agent, timeout=10
        )
        assert r.status_code == 200, r.text
        ack = r.json()
        assert not ack.get("dropped"), ack
        if ack["duplicate"]:
            return False
        for t in times:
            for g in range(GPUS):
                for f in FIELDS:
                    self.sent[(g, t // 60 * 60)][f].append(value(f, t, g))
        return True

    def expected(self, minutes: list[int]) -> dict[Key, dict[str, tuple[float, float, float]]]:
        """(min, mean, max) of each field for each GPU and minute, from the samples sent."""
        return {
            (g, m): {f: (min(v), sum(v) / len(v), max(v)) for f, v in self.sent[(g, m)].items()}
            for g in range(GPUS)
            for m in minutes
            if (g, m) in self.sent
        }

    def stored(self) -> dict[Key, dict[str, tuple[float, float, float]]]:
        """The rollups the API serves (``resolution=minute``), as (min, mean, max)."""
        out = {}
        for g in range(GPUS):
            r = httpx.get(
                f"{self.url}/api/v1/nodes/n1/gpus/{g}/series",
                params={"resolution": "minute", "fields": list(FIELDS)},
                headers=self.viewer,
                timeout=10,
            )
            assert r.status_code == 200, r.text
            s = r.json()
            for i, m in enumerate(s["t"]):
                out[(g, int(m))] = {
                    f: (s["min"][f][i], s["fields"][f][i], s["max"][f][i]) for f in FIELDS
                }
        return out


def same(got: dict[str, tuple[float, float, float]], want: dict[str, Any]) -> bool:
    return got.keys() == want.keys() and all(
        math.isclose(a, b, rel_tol=1e-12)
        for f in want
        for a, b in zip(got[f], want[f], strict=True)
    )


def check(fleet: Fleet, closed: list[int], current: int, when: str) -> None:
    """Every closed minute stored with exactly its samples' statistics; the open minute absent
    or right (it may have closed and been written meanwhile)."""
    stored, want = fleet.stored(), fleet.expected(closed)
    missing = sorted(k for k in want if k not in stored)
    assert not missing, f"{when}: closed minutes (gpu, minute_s) lost: {missing}"
    wrong = {k: (stored[k], want[k]) for k in want if not same(stored[k], want[k])}
    assert not wrong, f"{when}: rollups differ from the samples sent: {wrong}"
    for k, now in fleet.expected([current]).items():
        assert k not in stored or same(stored[k], now), f"{when}: open minute {k} wrong"
    assert set(stored) <= set(want) | {(g, current) for g in range(GPUS)}, when


def durable(fleet: Fleet, closed: list[int]) -> None:
    """Wait (bounded, no verdict) until the API shows the closed minutes as sent: a minute is
    written within the controller's flush period after its end and grace, or after its late
    samples came."""
    want = fleet.expected(closed)
    wait_until(
        lambda: all(k in (s := fleet.stored()) and same(s[k], v) for k, v in want.items()),
        rollups.CLOSE_GRACE_S + 10,
    )


def kill9(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


def test_kill9_loses_no_closed_minute(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = make_engine(database_url(data, None))
    migrate(engine)
    store = ControlStore(engine, clock=time.time)
    fleet = Fleet(store.tokens.create("agent")[0], store.tokens.create("viewer")[0])
    engine.dispose()
    port = free_port()
    args = ["controller", "--data-dir", str(data), "--port", str(port), "--scheduler", "none"]

    def controller() -> subprocess.Popen[str]:
        proc, info = start([*args, "--json"], tmp_path)
        fleet.url = info["url"]
        return proc

    now = int(time.time())
    current = now // 60 * 60
    closed = [current - 180, current - 120, current - 60]
    times = [t for t in range(closed[0], now, STEP_S)]
    batches = [[t for t in times if b <= t < b + BATCH_S] for b in range(closed[0], now, BATCH_S)]
    batches = [b for b in batches if b]
    # held back to come late: the last 10 s of the oldest-but-one minute and the middle of
    # the newest closed one (its 20th-30th s), as an agent's spool replays them after an outage
    late = [b for b in batches if b[0] in (closed[1] + 50, closed[2] + 20)]
    on_time = [b for b in batches if b not in late]

    proc = controller()
    try:
        # 1. the minutes come in order (a batch straddles each minute's end); killed once the
        #    closed ones are written: right after they closed, the newest 0-60 s ago
        first_seqs = {}
        for b in on_time:
            assert fleet.push(b)
            first_seqs[fleet.seq] = b
        durable(fleet, closed)
        kill9(proc)
        proc = controller()
        check(fleet, closed, current, "after kill -9 #1")

        # 2. late samples of two closed minutes, inside the old 90 s lateness window, merged
        #    into the rows the killed process wrote; the agent replays batches already
        #    acknowledged (duplicates: nothing counts twice); killed once the merges are written
        for b in late:
            assert fleet.push(b)
        for seq, b in list(first_seqs.items())[:4]:
            assert not fleet.push(b, seq=seq)
        assert fleet.push([closed[0] + 59])  # one more of the oldest minute, 2-3 min late
        durable(fleet, closed)
        kill9(proc)
        proc = controller()
        check(fleet, closed, current, "after kill -9 #2")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
