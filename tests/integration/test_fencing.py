"""Fencing and leases end to end (issue 12, items 1, 2 and 9), with real processes only.

A real controller (``python -m gpufleet controller --scheduler embedded``) and real agents
(``python -m gpufleet agent --sim ... --run-jobs --executor process``) reaching it through small
TCP proxies (`gpufleet.testing.procs`). Every job is a shell whose grandchild appends
``generation time`` heartbeats to a file, so what ran when is read from the file alone.

- item 1: ``kill -9`` of an agent takes its job's grandchild down within lease + margin, and
  the next generation starts only after the last heartbeat of the old one;
- item 1 and 2: a partition longer than the lease fences the copy on the cut-off node; the job
  is requeued (never ``failed``) and runs elsewhere, never two generations at once;
- item 2: a controller outage well inside the lease (kill -9, then a restart 0.4 of the lease
  later) kills nothing: same generation, not requeued;
- item 9: a controller restart with agents pushing every second loses no node.

Lease and outages are scaled to the machine: the long-lease agent's lease is at least
``LONG_LEASE_S`` and a multiple of the controller's measured start time. The outage is the
test's wait plus the restart, and a restart under the suite's load took 7x the first start
(9 s against 1.3 s on a CI run, where a 12 s lease left the test no room): the wait is 0.4 of
the lease, so the restart may take a further 0.4 of it (16 s) before the test could no longer
produce an outage inside the lease.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.schedulers.embedded.runner import TERM_GRACE_S
from gpufleet.testing.procs import (
    AgentProcess,
    ControllerProcess,
    TcpProxy,
    create_tokens,
    heartbeat_job,
    overlaps,
    processes_with,
    read_beats,
)
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled

pytestmark = [pytest.mark.slow, pytest.mark.process]
# protocol times grow with GPUFLEET_TEST_TIME_SCALE: a slow machine slows the lease, not the verdict
SHORT_LEASE_S = scaled(4.0)
LONG_LEASE_S = scaled(40.0)
# the wrapper's TERM grace, its check step, a loaded machine
MARGIN_S = scaled(TERM_GRACE_S + 2.0)


@dataclass
class Fleet:
    ctl: ControllerProcess
    agents: dict[str, AgentProcess]
    proxies: dict[str, TcpProxy]
    start_s: float  # how long the controller took to start the first time
    long_lease_s: float
    tmp: Path

    def on_node(self, job_id: str) -> str:
        def placed() -> str | None:
            doc = self.ctl.job(job_id)
            return doc["nodes"][0] if doc["state"] == "running" and doc["nodes"] else None

        node: str = wait_for(placed, 60, f"job {job_id} running")
        return node

    def heal(self) -> None:
        """Back to a whole fleet: every proxy open, every agent running and in service."""
        for p in self.proxies.values():
            p.heal()
        for a in self.agents.values():
            if not a.alive():
                a.start()
        for name in self.agents:
            self.ctl.wait_in_service(name)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fence")
    names = {"c1": "agent", "c2": "agent", "c3": "agent"}
    toks = create_tokens(
        tmp / "data", {"admin": ("admin", None), **{n: (r, n) for n, r in names.items()}}
    )
    ctl = ControllerProcess(tmp / "data", toks["admin"])
    t0 = time.monotonic()
    ctl.start()
    start_s = time.monotonic() - t0
    long_lease = min(180.0, max(LONG_LEASE_S, 6.0 * start_s))
    proxies = {n: TcpProxy(ctl.port).start() for n in names}
    agents = {
        n: AgentProcess(
            n,
            proxies[n].url,
            toks[n],
            tmp / n,
            lease_s=long_lease if n == "c3" else SHORT_LEASE_S,
            push_interval_s=1.0 if n == "c3" else 0.5,
            model="h200" if n == "c3" else "h100-sxm",  # long-lease jobs ask for an h200
        ).start()
        for n in names
    }
    f = Fleet(ctl, agents, proxies, start_s, long_lease, tmp)
    try:
        f.heal()
        yield f
    finally:
        for a in agents.values():
            a.stop()
        for p in proxies.values():
            p.stop()
        ctl.stop()


def _no_overlap_and_done(f: Fleet, job_id: str, beats: Path) -> dict[str, object]:
    doc = f.ctl.wait_ended(job_id)
    assert doc["state"] == "succeeded", doc
    seen = read_beats(beats)
    assert overlaps(seen) == [], f"two generations alive at once: {seen.runs}"
    assert seen.done and seen.done[-1] == max(seen.runs), seen
    return dict(doc)


def test_agent_kill_9(fleet: Fleet) -> None:
    beats = fleet.tmp / "beats-kill"
    job = fleet.ctl.submit("kill9", heartbeat_job(beats, 60), gpu_model="h100-sxm", max_restarts=5)
    node = fleet.on_node(job)
    wait_for(lambda: processes_with(str(beats)), 30, "heartbeat grandchild running")
    killed_at = time.time()
    fleet.agents[node].kill9()
    wait_for(lambda: not processes_with(str(beats)), SHORT_LEASE_S + MARGIN_S, "grandchild dead")
    dead_after = time.time() - killed_at
    print(f"\nagent kill -9 -> heartbeat grandchild dead after {dead_after:.2f} s")
    assert dead_after < SHORT_LEASE_S + MARGIN_S
    doc = _no_overlap_and_done(fleet, job, beats)
    seen = read_beats(beats)
    assert seen.runs[1][1] <= killed_at + SHORT_LEASE_S + MARGIN_S
    assert len(seen.runs) >= 2 and doc["restarts"] is not None
    # job state (logs, exit files, launch specs with the job's env, the lease) is private
    for agent in fleet.agents.values():
        jobs = agent.state_dir / "jobs"
        for path in [jobs, *jobs.rglob("*")] if jobs.exists() else []:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    fleet.heal()


def test_partition_longer_than_the_lease_fences_and_requeues(fleet: Fleet) -> None:
    beats = fleet.tmp / "beats-cut"
    job = fleet.ctl.submit("cut", heartbeat_job(beats, 60), gpu_model="h100-sxm", max_restarts=5)
    node = fleet.on_node(job)
    wait_for(lambda: 1 in read_beats(beats).runs, 30, "heartbeats")
    cut_at = time.time()
    fleet.proxies[node].cut()
    wait_for(lambda: not processes_with(str(beats)), 2 * SHORT_LEASE_S + MARGIN_S, "fenced")
    last_beat = read_beats(beats).runs[1][1]
    print(f"\npartition -> last heartbeat of the cut-off copy {last_beat - cut_at:.2f} s later")
    # the lease counts from the last contact, which came before the cut
    assert last_beat - cut_at < SHORT_LEASE_S + MARGIN_S
    time.sleep(max(0.0, cut_at + 2 * SHORT_LEASE_S - time.time()))
    fleet.proxies[node].heal()
    doc = _no_overlap_and_done(fleet, job, beats)
    attempts = doc["attempts"]
    assert isinstance(attempts, list) and len(attempts) >= 2
    assert all(not str(a["outcome"]).startswith("failed") for a in attempts)
    fleet.heal()


def test_controller_outage_inside_the_lease_kills_nothing(fleet: Fleet) -> None:
    lease = fleet.long_lease_s
    beats = fleet.tmp / "beats-outage"
    beats_n = int((lease * 2 + 30) / 0.1)
    job = fleet.ctl.submit("outage", heartbeat_job(beats, beats_n), gpu_model="h200")
    assert fleet.on_node(job) == "c3"
    wait_for(lambda: 1 in read_beats(beats).runs, 30, "heartbeats")
    down_at = time.monotonic()
    fleet.ctl.kill9()
    time.sleep(0.4 * lease)
    fleet.ctl.start(wait_s=lease)
    outage = time.monotonic() - down_at
    print(f"\ncontroller outage {outage:.1f} s with a {lease:g} s lease")
    assert outage < 0.8 * lease, "the controller restarts too slowly for this lease"
    time.sleep(3.0)  # the agents are back and report; nothing is fenced or requeued
    doc = fleet.ctl.job(job)
    assert doc["state"] == "running" and doc["restarts"] == 0, doc
    assert [a["generation"] for a in doc["attempts"]] == [1]
    seen = read_beats(beats)
    assert list(seen.runs) == [1] and processes_with(str(beats)), "the copy survived"
    fleet.ctl.call("POST", f"/api/v1/jobs/{job}/cancel").raise_for_status()
    wait_for(lambda: not processes_with(str(beats)), 30, "cancelled copy gone")


def test_controller_restart_loses_no_node(fleet: Fleet) -> None:
    fleet.heal()
    fleet.ctl.kill9()
    fleet.ctl.start(wait_s=180)
    ready = time.monotonic()
    states: dict[str, set[str]] = {n: set() for n in fleet.agents}
    # the longest an agent may take to be heard again: its backoff cap and one push interval
    # (1 s each for c3), three heartbeats of lost threshold, and a loaded machine's slack
    while time.monotonic() - ready < 10.0:
        for n in fleet.agents:
            states[n].add(fleet.ctl.node_state(n) or "?")
        time.sleep(0.1)
    assert all("lost" not in s for s in states.values()), states
    since = time.time() - (time.monotonic() - ready) - 1.0
    r = fleet.ctl.call("GET", "/api/v1/events", params={"kind": "transition", "limit": 500})
    r.raise_for_status()
    lost = [e for e in r.json() if e["at_s"] >= since and e["data"].get("to") == "lost"]
    assert lost == [], lost
