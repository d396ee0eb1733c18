"""A scheduler that takes 20 s to answer ``is_idle``, ``drain`` and ``exchange`` does not delay
ingest acknowledgements or API reads of a real controller (uvicorn in its own process, real
HTTP): while those calls are in flight every request is answered, none waits anywhere near the
scheduler's delay, and the late ``is_idle`` answer still completes the drain.

The p99 figure (under 200 ms, docs/control-plane.md) is `benchmarks/slow_scheduler.py`'s: it
runs `measure` below against the same rig and prints p99 against the p99 before the slow calls
began; judged here, a loaded CI machine failed it at 546 ms with the logic sound."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.timescale import scaled
from tests.control.conftest import batch, fail_finding, free_port

pytestmark = pytest.mark.process


DELAY_S = scaled(20.0)
# a request that waited on the scheduler would take DELAY_S; one that did not takes
# milliseconds, 546 ms at worst on a loaded 2-core machine: a quarter of the delay tells them apart
WAITED_MS = DELAY_S * 1000 / 4
NODES = 20  # the breaker (10 % out) lets one of 20 nodes drain


@pytest.fixture
def slow_controller(tmp_path: Path) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    with slow_rig(tmp_path, DELAY_S) as rig:
        yield rig


@contextlib.contextmanager
def slow_rig(tmp_path: Path, delay_s: float) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """The slow controller's process on a free port, its HTTP client and tokens."""
    port = free_port()
    script = Path(__file__).with_name("slow_controller.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(port), str(delay_s)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    tokens_file = tmp_path / "tokens.json"
    try:
        end = time.monotonic() + 60
        while not tokens_file.exists():
            if proc.poll() is not None or time.monotonic() > end:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"slow controller did not start: {err[-2000:]}")
            time.sleep(0.1)
        tokens = json.loads(tokens_file.read_text())
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client, tokens
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _wait(pred: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + scaled(timeout)
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_slow_scheduler_delays_neither_ingest_nor_reads(
    slow_controller: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, tokens = slow_controller
    measured = measure(client, tokens, DELAY_S)
    for slow, (ingest_ms, read_ms) in measured.items():
        if slow == "before":
            continue
        print(f"\n{slow} in flight: ingest p99 {p99(ingest_ms):.0f} ms, read {p99(read_ms):.0f} ms")
        assert len(ingest_ms) >= 50 and len(read_ms) >= 50
        assert max(ingest_ms) < WAITED_MS, f"{slow}: an ingest took {max(ingest_ms):.0f} ms"
        assert max(read_ms) < WAITED_MS, f"{slow}: a read took {max(read_ms):.0f} ms"


def measure(
    client: httpx.Client, tokens: dict[str, str], delay_s: float
) -> dict[str, tuple[list[float], list[float]]]:
    """Ingest and read latencies (ms): for 6 s before any slow call ("before"), then 6 s inside
    each slow call ("drain", then "is_idle"); checks on the way that the calls were in flight
    and that the late answer completes the drain."""
    agent = {"Authorization": f"Bearer {tokens['agent']}"}
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    now = time.time()
    for i in range(NODES):
        r = client.post("/api/v1/ingest", json=batch(f"n{i:02d}", 1, t=now), headers=agent)
        assert r.status_code == 200, r.text

    def node_state(name: str) -> str:
        r = client.get(f"/api/v1/nodes/{name}", headers=admin)
        return str(r.json()["node"]["state"])

    def in_flight() -> dict[str, int]:
        return dict(client.get("/test/scheduler").json()["in_flight"])

    reads = ("/api/v1/summary", "/api/v1/nodes", "/api/v1/nodes/n00", "/api/v1/events?limit=20")
    for path in reads:  # first calls build response models: not what is measured
        assert client.get(path, headers=admin).status_code == 200
    seq = 10
    out: dict[str, tuple[list[float], list[float]]] = {}
    failing = False  # n00 reports its fail finding (once the drain is under way)

    def traffic(seconds: float, until: Any = None) -> tuple[list[float], list[float]]:
        """Every node pushes and the API is read, for ``seconds`` or until ``until()``."""
        nonlocal seq
        ingest_ms: list[float] = []
        read_ms: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (until is not None and until()):
            seq += 1
            body = batch(f"n{seq % NODES:02d}", seq, t=time.time(), devices=False)
            if failing and seq % NODES == 0:
                body["findings"] = [fail_finding("n00")]
                body["health"] = 2
            t0 = time.perf_counter()
            r = client.post("/api/v1/ingest", json=body, headers=agent)
            ingest_ms.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
            path = reads[seq % len(reads)]
            t0 = time.perf_counter()
            r = client.get(path, headers=admin)
            read_ms.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
        return ingest_ms, read_ms

    out["before"] = traffic(6.0)  # no slow call yet: the baseline
    seq += NODES - seq % NODES  # n00's next
    bad = batch("n00", seq, t=time.time(), devices=False, findings=[fail_finding("n00")], health=2)
    assert client.post("/api/v1/ingest", json=bad, headers=agent).status_code == 200
    assert node_state("n00") == "draining"
    failing = True
    # the remediation drain is with the scheduler for DELAY_S; is_idle is asked only once the
    # scheduler confirmed the drain (a drain still in flight must not count as done), and then
    # takes DELAY_S too: ingest and reads are measured inside each of the two slow calls
    for slow in ("drain", "is_idle"):
        traffic(delay_s + 10, until=lambda slow=slow: in_flight().get(slow, 0) > 0)
        flying = in_flight()
        assert flying.get(slow, 0) > 0 and flying.get("exchange", 0) > 0, (slow, flying)
        started = time.monotonic()
        ingest_ms, read_ms = traffic(6.0)
        flying = in_flight()
        assert flying.get(slow, 0) > 0 and flying.get("exchange", 0) > 0, (slow, flying)
        assert time.monotonic() - started < delay_s  # the window lay inside the slow call
        assert node_state("n00") == "draining"  # not drained before the scheduler said idle
        out[slow] = (ingest_ms, read_ms)
    # the late answer (idle) comes back to the writer and completes the drain; n00 keeps
    # pushing meanwhile (a silent node would be declared lost first)
    beat = iter(range(seq + 1, seq + 10_000))

    def drained() -> bool:
        body = batch("n00", next(beat), t=time.time(), devices=False)
        body.update(findings=[fail_finding("n00")], health=2)
        assert client.post("/api/v1/ingest", json=body, headers=agent).status_code == 200
        return node_state("n00") == "drained"

    _wait(drained, delay_s + 20, "n00 drained")
    return out
