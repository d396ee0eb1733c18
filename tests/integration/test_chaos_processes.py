"""Chaos with real processes (issue 12, "Tests and figures"): exactly once under agent crashes,
controller crashes, GPU faults and network partitions.

One real controller process (embedded scheduler) and real agent processes running real job
processes (`gpufleet.testing.procs`), reaching the controller through TCP proxies. Every job is
a shell whose grandchild appends ``generation time`` heartbeats to a file. Each seed submits two
jobs and injects one fault drawn from its number (`plan`):

- ``agent``: ``kill -9`` of the agent of the node running its jobs, back after 0.2-2x the lease;
- ``controller``: ``kill -9`` of the controller, restarted 0.2-2x the lease later;
- ``partition``: the node's agent stays up but cannot reach the controller for 0.2-2x the lease;
- ``xid``: a GPU of its jobs' node falls off the bus (XID 79, the simulator's fault injection).

From the heartbeats and the jobs API it asserts, per seed: never two generations of a job alive
at the same instant; no job ``failed`` (every fault here is infrastructure, and the jobs allow
no restart of their own: ``max_restarts`` 0); every job finishes exactly once (one attempt ending
``exit 0``, the last generation's heartbeats complete); ``restarts`` stays 0 and ``requeues``
counts the requeued attempts (docs/scheduling.md); no job process outlives the seed.

Seeds run concurrently, a round at a time, in one controller lifetime: each seed's jobs belong to
its own tenant (``t<seed>``), whose nodes are the seed's alone for the round, so a node fault
hits that seed's jobs only. A controller ``kill -9`` hits every job in flight: the controller
seeds of a round take turns (submit, wait running, kill, restart), and every other seed of the
round lives through their outages as well. The lease is 3 s (``GPUFLEET_CHAOS_LEASE_S``) and
outages scale with it.

    GPUFLEET_CHAOS_SEEDS=40     seeds 0..39 (default 20: each fault five times)
    GPUFLEET_CHAOS_ROUND=10     seeds per round (default 10)
    GPUFLEET_CHAOS_ONLY=5,13    just these seeds (one round), to reproduce a failure

A failing round names each failing seed with its plan (`Plan.describe`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.procs import (
    AgentProcess,
    ControllerProcess,
    TcpProxy,
    create_tokens,
    heartbeat_job,
    overlaps,
    processes_with,
    read_beats,
    stop_all,
)
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled

# protocol times grow with GPUFLEET_TEST_TIME_SCALE: a slow machine slows the lease, not the verdict
LEASE_S = scaled(float(os.environ.get("GPUFLEET_CHAOS_LEASE_S", "3")))
KINDS = ("agent", "controller", "partition", "xid")
ONLY = [int(s) for s in os.environ.get("GPUFLEET_CHAOS_ONLY", "").split(",") if s.strip()]
SEEDS = ONLY or list(range(int(os.environ.get("GPUFLEET_CHAOS_SEEDS", "20"))))
ROUND = len(ONLY) or int(os.environ.get("GPUFLEET_CHAOS_ROUND", "10"))
ROUNDS = [SEEDS[i : i + ROUND] for i in range(0, len(SEEDS), ROUND)]
PUSH_S = scaled(0.5)
# a loaded machine misses heartbeats (nodes go lost and come back): requeues the cap would
# turn into failures; the cap itself is tested in tests/scheduling
MAX_REQUEUES = 50
# a job still not ended this long after its fault is a failure, not slowness
ENDED_S = scaled(120.0)

pytestmark = [pytest.mark.slow, pytest.mark.process]


@dataclass(frozen=True)
class Plan:
    """What seed ``seed`` does, drawn from its number alone."""

    seed: int
    kind: str
    delay_s: float  # from both jobs running to the fault
    outage_s: float  # agent down / controller down / partition, 0.2-2x the lease
    beats: tuple[int, int]  # heartbeats of each job (0.1 s apart)
    xid_at_s: float  # xid: GPU 0 falls off the bus this long after its agent started

    @staticmethod
    def of(seed: int) -> Plan:
        rng = random.Random(seed)
        kind = KINDS[seed % len(KINDS)]
        delay = rng.uniform(0.2, 1.5)
        outage = rng.uniform(0.2, 2.0) * LEASE_S
        # an xid job runs long enough to be on its node when the GPU falls off
        lo, hi = (80, 120) if kind == "xid" else (20, 40)
        beats = (rng.randint(lo, hi), rng.randint(lo, hi))
        return Plan(seed, kind, delay, outage, beats, rng.uniform(5.0, 8.0))

    @property
    def nodes_needed(self) -> int:
        """Pool nodes: a node to fault and one to fail over to (a controller seed's jobs stay
        where they are; an xid seed's faulty node is a fresh one of its own)."""
        return 1 if self.kind in ("controller", "xid") else 2

    def describe(self) -> str:
        what = {
            "agent": f"agent kill -9, back after {self.outage_s:.2f} s",
            "controller": f"controller kill -9, down {self.outage_s:.2f} s",
            "partition": f"partition of {self.outage_s:.2f} s",
            "xid": f"XID 79 on GPU 0 {self.xid_at_s:.2f} s after its agent started",
        }[self.kind]
        return (
            f"seed {self.seed}: {self.kind}, {self.delay_s:.2f} s after its jobs run: {what}; "
            f"jobs of {self.beats[0]} and {self.beats[1]} beats (lease {LEASE_S:g} s)"
        )


def _pool_size() -> int:
    return max(sum(Plan.of(s).nodes_needed for s in r) for r in ROUNDS)


class Gate:
    """Submissions (shared) against a controller kill (exclusive): a submit is not idempotent,
    so none may be cut by a kill and retried."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._down = False

    @contextmanager
    def up(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._down)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def down(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._down and self._shared == 0)
            self._down = True
        try:
            yield
        finally:
            with self._cond:
                self._down = False
                self._cond.notify_all()


FINAL = ("succeeded", "failed", "cancelled")


class JobWatch:
    """One thread polls the job list for every seed (a dozen seeds each polling their own jobs
    were a load on the controller of their own); seeds wait on its snapshot."""

    def __init__(self, ctl: ControllerProcess, every_s: float = 0.2) -> None:
        self.ctl = ctl
        self.every_s = every_s
        self._cond = threading.Condition()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                r = self.ctl.call("GET", "/api/v1/jobs")
                jobs = {j["id"]: j for j in r.json()["jobs"]} if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                jobs = None  # the controller is down or slow: the next poll
            if jobs is not None:
                with self._cond:
                    self._jobs = jobs
                    self._cond.notify_all()

    def wait(self, job_id: str, states: tuple[str, ...], timeout_s: float) -> dict[str, Any]:
        """The job once its state is one of ``states``."""

        def seen() -> dict[str, Any] | None:
            doc = self._jobs.get(job_id)
            return doc if doc is not None and doc["state"] in states else None

        with self._cond:
            if not self._cond.wait_for(seen, timeout_s):
                raise TimeoutError(f"job {job_id}: not {'/'.join(states)} within {timeout_s} s")
            doc = seen()
        assert doc is not None
        return doc


@dataclass
class Chaos:
    ctl: ControllerProcess
    agents: dict[str, AgentProcess]  # the pool, reused round after round
    proxies: dict[str, TcpProxy]
    tokens: dict[str, str]
    tmp: Path
    start_s: float  # the controller's first start, taken off each outage
    watch: JobWatch
    ctl_turn: threading.Lock = field(default_factory=threading.Lock)  # one controller seed
    gate: Gate = field(default_factory=lambda: Gate())
    log: list[str] = field(default_factory=list)

    def healthy(self) -> None:
        for p in self.proxies.values():
            p.heal()
        for a in self.agents.values():
            if not a.alive():
                a.start()
        for n in self.agents:
            self.ctl.wait_in_service(n)

    def running_on(self, job_id: str) -> str:
        """The node the job runs on (or ran on, if it already ended: a slow poll may miss a
        short run; the fault then hits no copy of it, the checks still hold)."""
        doc = self.watch.wait(job_id, ("running", *FINAL), 60)
        node: str = doc["nodes"][0]
        return node

    def give(self, node: str, tenant: str) -> None:
        r = self.ctl.call("PATCH", f"/api/v1/nodes/{node}", json={"tenant": tenant})
        assert r.status_code == 200, (node, r.status_code, r.text)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chaos]:
    tmp = tmp_path_factory.mktemp("chaos")
    pool = [f"n{i:02d}" for i in range(_pool_size())]
    wanted: dict[str, tuple[str, str | None]] = {"admin": ("admin", None)}
    wanted.update({n: ("agent", n) for n in pool})
    wanted.update({_xid_node(s): ("agent", _xid_node(s)) for s in SEEDS if s % 4 == 3})
    tokens = create_tokens(tmp / "data", wanted)
    ctl = ControllerProcess(tmp / "data", tokens["admin"])
    t0 = time.monotonic()
    ctl.start(wait_s=120)
    start_s = time.monotonic() - t0
    proxies = {n: TcpProxy(ctl.port).start() for n in pool}
    agents = {
        n: AgentProcess(
            n,
            proxies[n].url,
            tokens[n],
            tmp / n,
            lease_s=LEASE_S,
            push_interval_s=PUSH_S,
            fast_interval_s=PUSH_S,
        )
        for n in pool
    }
    c = Chaos(ctl, agents, proxies, tokens, tmp, start_s, JobWatch(ctl).start())
    try:
        c.healthy()
        c.log.append(f"fleet of {len(pool)} nodes up in {time.monotonic() - t0:.1f} s")
        yield c
    finally:
        c.watch.stop()
        stop_all(list(c.agents.values()))
        for p in proxies.values():
            p.stop()
        ctl.stop()
        print("\n" + "\n".join(c.log))


def _xid_node(seed: int) -> str:
    return f"a{seed:03d}"  # sorts before the pool: placement's tie goes to the lower name


@dataclass
class Seed:
    """One seed of a round: its plan, its nodes, its jobs and what happened."""

    plan: Plan
    nodes: list[str]
    jobs: list[tuple[str, Path]] = field(default_factory=list)
    done: str = ""

    @property
    def tenant(self) -> str:
        return f"t{self.plan.seed}"

    def submit(self, c: Chaos) -> None:
        for i, n in enumerate(self.plan.beats):
            beats = c.tmp / f"beats-{self.plan.seed}-{i}"
            name = f"chaos-{self.plan.seed}-{i}"
            command = heartbeat_job(beats, n)
            spec = {"tenant": self.tenant, "max_restarts": 0, "max_requeues": MAX_REQUEUES}
            job_id = c.ctl.submit(name, command, **spec)
            self.jobs.append((job_id, beats))

    def running(self, c: Chaos) -> str:
        """Wait for both jobs to run; the node of the first."""
        target = c.running_on(self.jobs[0][0])
        for job_id, _ in self.jobs[1:]:
            c.running_on(job_id)
        return target


def _fault(c: Chaos, s: Seed) -> None:
    """Submit the seed's jobs, wait for them to run, inject its fault; ``s.done`` says what
    was done."""
    p = s.plan
    if p.kind == "controller":
        with c.ctl_turn:  # one controller seed at a time: its jobs are in flight at its kill
            s.submit(c)
            s.running(c)
            time.sleep(p.delay_s)
            with c.gate.down():
                down = time.monotonic()
                c.ctl.kill9()
                time.sleep(max(0.0, p.outage_s - c.start_s))
                c.ctl.start(wait_s=120)
                s.done = f"controller down {time.monotonic() - down:.1f} s"
        return
    with c.gate.up():
        s.submit(c)
    target = s.running(c)
    if p.kind == "xid":
        hit = "on it" if target == s.nodes[0] else "elsewhere: its GPU fell before"
        s.done = f"XID 79 on {s.nodes[0]}, jobs {hit}"
        return
    time.sleep(p.delay_s)
    if p.kind == "agent":
        c.agents[target].kill9()
        time.sleep(p.outage_s)
        c.agents[target].start()
        s.done = f"agent {target} kill -9, back after {p.outage_s:.1f} s"
    else:
        c.proxies[target].cut()
        time.sleep(p.outage_s)
        c.proxies[target].heal()
        s.done = f"partition of {target} for {p.outage_s:.1f} s"


def _check_job(c: Chaos, job_id: str, beats: Path) -> str:
    c.watch.wait(job_id, FINAL, ENDED_S)
    doc: dict[str, Any] = wait_for(lambda: c.ctl.job(job_id), 60, f"job {job_id}", step_s=0.5)
    attempts = doc["attempts"]
    assert doc["state"] == "succeeded", f"job {job_id} ended {doc['state']}: {attempts}"
    seen = read_beats(beats)
    assert overlaps(seen) == [], f"job {job_id}: two generations at once {seen.runs}"
    finished = [a for a in attempts if a["outcome"] == "exit 0"]
    assert len(finished) == 1, attempts
    last = max(seen.runs)
    assert finished[0]["generation"] == last and last in seen.done, (attempts, seen)
    # every fault here is the infrastructure's: none consumes the job's own restart budget,
    # each requeue of a started copy counts in `requeues` (docs/scheduling.md)
    requeued = [a for a in attempts if str(a["outcome"]).startswith("requeued")]
    fenced = [a for a in requeued if "fenced" in str(a["outcome"])]
    assert doc["restarts"] == 0, (doc["restarts"], attempts)
    assert len(fenced) <= doc["requeues"] <= len(requeued), (doc["requeues"], attempts)
    gone = f"job {job_id}'s processes gone"
    wait_for(lambda: not processes_with(str(beats)), 15, gone, step_s=0.2)
    path = "->".join(",".join(a["nodes"]) for a in attempts)
    return f"job {job_id}: {path}, requeues {doc['requeues']}"


def _run_seed(c: Chaos, s: Seed) -> str:
    _fault(c, s)
    results = [_check_job(c, j, b) for j, b in s.jobs]
    return f"{s.done}; " + "; ".join(results)


def _deal(c: Chaos, seeds: list[int]) -> tuple[list[Seed], list[AgentProcess]]:
    """Each seed its nodes (pool nodes in name order, a fresh node for an xid seed's fault),
    given to its tenant; the xid seeds' agents started."""
    free = sorted(c.agents)
    out: list[Seed] = []
    extra: list[AgentProcess] = []
    try:
        _deal_into(c, seeds, free, out, extra)
    except BaseException:
        stop_all(extra)
        raise
    return out, extra


def _deal_into(
    c: Chaos, seeds: list[int], free: list[str], out: list[Seed], extra: list[AgentProcess]
) -> None:
    for seed in seeds:
        plan = Plan.of(seed)
        mine = [free.pop(0) for _ in range(plan.nodes_needed)]
        if plan.kind == "xid":
            name = _xid_node(seed)
            fault = {"kind": "fallen_off_bus", "gpu": 0, "at_s": plan.xid_at_s}
            agent = AgentProcess(
                name,
                c.ctl.url,
                c.tokens[name],
                c.tmp / name,
                lease_s=LEASE_S,
                push_interval_s=PUSH_S,
                fast_interval_s=PUSH_S,
                faults=[fault],
            )
            extra.append(agent.start())
            mine.insert(0, name)
        out.append(Seed(plan, mine))
    for s in out:  # every node its tenant before any job is submitted
        for n in s.nodes:
            # an xid seed's node: known, maybe not in service (its GPU may be gone already)
            wait_for(partial(c.ctl.node_state, n), 120, f"node {n} registered", step_s=0.2)
            c.give(n, s.tenant)


@pytest.mark.parametrize("seeds", ROUNDS, ids=[f"seeds{r[0]}-{r[-1]}" for r in ROUNDS])
def test_chaos_round(chaos: Chaos, seeds: list[int]) -> None:
    chaos.healthy()
    t0 = time.monotonic()
    round_, extra = _deal(chaos, seeds)
    failures: list[str] = []
    try:
        with ThreadPoolExecutor(max_workers=len(round_)) as pool:
            futures = [(s, pool.submit(_run_seed, chaos, s)) for s in round_]
            for s, fut in futures:
                try:
                    chaos.log.append(f"seed {s.plan.seed} ({s.plan.kind}): {fut.result()}")
                except Exception as exc:  # every seed's outcome, then fail naming each
                    failures.append(f"{s.plan.describe()} on {s.nodes}: {s.done}\n  {exc!r}")
    finally:
        stop_all(extra)
    chaos.log.append(f"round {seeds}: {time.monotonic() - t0:.1f} s")
    assert not failures, "\n".join(failures)
