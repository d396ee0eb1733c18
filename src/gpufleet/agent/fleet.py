"""Many real agents in one process: the simulated (or local) nodes of `gpufleet up` and
`gpufleet sim-fleet`.

Every node is a full `gpufleet.agent.runner.Agent` (sampler, health rules, spool, push, job
runner); there is no second, lighter agent. What the agents share is what a thousand of them
cannot each own:

- device calls run on one `CallPool` (a few threads that are replaced while a call hangs), so
  a hung NVML call on one GPU holds one thread and never stalls another node;
- a small `FleetDriver` calls each agent's ``tick`` and ``push_once`` on schedule from a few
  threads (sampling and pushing on separate threads, so a slow control plane never delays
  sampling), with the nodes' phases spread over the interval;
- one HTTP client (keep-alive connections) for every pusher;
- ring buffers sized to the intervals (`compact_config`) and the health window rebuilt from the
  rings instead of kept as objects, which is what holds a simulated 8-GPU node to about
  200 KB (`benchmarks/simfleet_scale.py`).
"""

from __future__ import annotations

import heapq
import logging
import math
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.gate import DaemonExecutor
from gpufleet.agent.jobs import DEFAULT_LEASE_S, AgentJobs
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.devices.backend import GpuBackend
from gpufleet.telemetry.sampler import DEFAULT_CALL_TIMEOUT_S
from gpufleet.telemetry.workers import CallPool

log = logging.getLogger("gpufleet.agent.fleet")

HEALTH_WINDOW_S = 130.0  # what the health rules look back over (the single agent's window)
SEQ_BLOCK = 64  # sequence numbers per agent-state write


@dataclass(frozen=True)
class FleetConfig:
    """How the agents of one process run (the CLI's flags)."""

    controller: str
    token: str  # for every node without its own token in ``tokens``
    state_dir: Path  # one sub-directory per node: identity, sequence numbers, spool, acks
    # node name -> an agent token bound to that node (only node-bound tokens may offer job
    # slots: `gpufleet up` and `gpufleet sim-fleet` make one per node)
    tokens: Mapping[str, str] = field(default_factory=dict)
    fast_interval_s: float = 1.0
    slow_interval_s: float = 30.0
    push_interval_s: float = 5.0
    heartbeat_interval_s: float | None = None
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    call_threads: int = 4
    validate_threads: int = 2  # level-1 validations of nodes waiting in validating
    tick_threads: int = 2
    push_threads: int = 8
    connections: int = 16
    push_timeout_s: float = 5.0
    verify: ssl.SSLContext | bool = True  # how an https controller is verified (httpx's verify)


def _rows(window_s: float, push_s: float, interval_s: float) -> int:
    """Ring rows for one tier: the health window, or two push intervals, plus one."""
    return max(math.ceil(window_s / interval_s), 2 * math.ceil(push_s / interval_s)) + 1


def compact_config(cfg: FleetConfig, state_dir: Path, node: str = "") -> AgentConfig:
    """One node's `AgentConfig`: rings just long enough for the health window and the rows
    between two pushes, no kept `Sample` objects (the window comes from the rings); the node's
    own token when ``cfg.tokens`` has one."""
    return AgentConfig(
        fast_interval_s=cfg.fast_interval_s,
        slow_interval_s=cfg.slow_interval_s,
        call_timeout_s=cfg.call_timeout_s,
        push_interval_s=cfg.push_interval_s,
        controller=cfg.controller,
        token=cfg.tokens.get(node, cfg.token),
        state_dir=state_dir,
        fast_capacity=_rows(HEALTH_WINDOW_S, cfg.push_interval_s, cfg.fast_interval_s),
        slow_capacity=_rows(HEALTH_WINDOW_S, cfg.push_interval_s, cfg.slow_interval_s),
        recent=0,
        heartbeat_interval_s=cfg.heartbeat_interval_s,
        seq_block=SEQ_BLOCK,
        in_process=True,
    )


class _Schedule:
    """A heap of (due time, agent index) that a few threads take turns on."""

    def __init__(self, n: int, interval_s: float, start: float) -> None:
        self.interval_s = interval_s
        # phases spread over the interval: the load is smooth, not a burst per round
        self.heap = [(start + interval_s * k / max(n, 1), k) for k in range(n)]
        heapq.heapify(self.heap)
        self.cond = threading.Condition()
        self.late = 0  # rounds that started more than one interval behind

    def take(self, stop: threading.Event) -> tuple[float, int] | None:
        with self.cond:
            while not stop.is_set():
                wait = None
                if self.heap:
                    wait = self.heap[0][0] - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self.heap)
                self.cond.wait(wait)
        return None

    def put_back(self, due: float, k: int) -> None:
        now = time.monotonic()
        nxt = due + self.interval_s
        if nxt < now - self.interval_s:
            self.late += 1
            nxt = now
        with self.cond:
            heapq.heappush(self.heap, (nxt, k))
            self.cond.notify()


@dataclass
class FleetStats:
    """What the agents of a driver achieved so far."""

    nodes: int
    gpus: int
    gpu_samples: int
    batches_acked: int
    errors: int
    throttled: int
    spooled: int
    late_rounds: int
    push_p50_ms: float | None
    push_p99_ms: float | None


@dataclass
class FleetDriver:
    """Runs the real agents of many nodes from a few threads; ``start``/``stop`` or ``run``."""

    backends: Sequence[GpuBackend]
    config: FleetConfig
    jobs: Mapping[str, AgentJobs] = field(default_factory=dict)
    transport: httpx.BaseTransport | None = None
    # called with a node's name before its agent reopens after an update (`reopen_agent`):
    # a simulated fleet re-reads its fleet file there (`sim_reloader`)
    before_reopen: Callable[[str], None] | None = None
    agents: list[Agent] = field(init=False, default_factory=list)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _threads: list[threading.Thread] = field(init=False, default_factory=list)
    _push_ms: deque[float] = field(init=False, default_factory=lambda: deque(maxlen=4096))
    _schedules: list[_Schedule] = field(init=False, default_factory=list)
    _stopped: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        cfg = self.config
        # a thread stuck past the sampler's own timeout is replaced before healthy GPUs queue
        # behind it long enough to count as stalled
        self.calls = CallPool(
            cfg.call_threads, stuck_after_s=cfg.call_timeout_s / 2, name="gpufleet-nvml"
        )
        limits = httpx.Limits(
            max_connections=cfg.connections, max_keepalive_connections=cfg.connections
        )
        self.client = httpx.Client(
            transport=self.transport, timeout=cfg.push_timeout_s, limits=limits, verify=cfg.verify
        )
        self.validations = DaemonExecutor(cfg.validate_threads)
        self._reopen_lock = threading.Lock()
        self.reopened = 0  # agents reopened after an update (tests, logs)
        for b in self.backends:
            self.agents.append(self._agent(b))

    def _agent(self, backend: GpuBackend) -> Agent:
        cfg = self.config
        agent = Agent(
            backend,
            compact_config(cfg, cfg.state_dir / backend.node_name, backend.node_name),
            calls=self.calls,
            client=self.client,
            validations=self.validations,
        )
        job_runner = self.jobs.get(backend.node_name)
        if job_runner is not None:
            if getattr(job_runner.slots, "__self__", None) is not None:
                job_runner.slots = agent.gpu_slots  # the reopened agent's GPUs
            agent.enable_jobs(job_runner)
        return agent

    def reopen_agent(self, k: int) -> Agent:
        """The agent ``k`` after its update ended and was reported: what a separate agent
        process does by re-executing itself, done in place. NVML (closed for the update) is
        opened afresh through a new backend over the same library, and a new agent over the
        same state directory (identity, sequence numbers, update keys) reports the devices'
        versions as they are now."""
        with self._reopen_lock:
            old = self.agents[k]
            if not old.restart_wanted:
                return old  # another thread reopened it already
            name = old.backend.node_name
            if self.before_reopen is not None:
                try:
                    self.before_reopen(name)
                except Exception:
                    log.exception("%s: preparing the reopen failed", name)
            fresh = getattr(old.backend, "reopened", None)
            backend = fresh() if callable(fresh) else old.backend
            new = self._agent(backend)
            self.agents[k] = new
            self.reopened += 1
            log.warning("%s: agent reopened after its update (NVML opened afresh)", name)
            return new

    # ----- running -----------------------------------------------------------------------
    def start(self) -> FleetDriver:
        cfg = self.config
        start = time.monotonic()
        ticks = _Schedule(len(self.agents), cfg.fast_interval_s, start)
        pushes = _Schedule(len(self.agents), cfg.push_interval_s, start + cfg.push_interval_s)
        self._schedules = [ticks, pushes]
        for i in range(cfg.tick_threads):
            self._spawn(f"gpufleet-fleet-tick-{i}", ticks, self._tick)
        for i in range(cfg.push_threads):
            self._spawn(f"gpufleet-fleet-push-{i}", pushes, self._push)
        return self

    def _spawn(self, name: str, schedule: _Schedule, work: Callable[[Agent], None]) -> None:
        t = threading.Thread(target=self._loop, args=(schedule, work), name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _loop(self, schedule: _Schedule, work: Callable[[Agent], None]) -> None:
        while True:
            item = schedule.take(self._stop)
            if item is None:
                return
            due, k = item
            try:
                agent = self.agents[k]
                if agent.restart_wanted:
                    agent = self.reopen_agent(k)
                work(agent)
            except Exception:  # an agent's parts never raise; this is the driver's own guard
                log.exception("agent %s: round failed", self.agents[k].hostname)
            schedule.put_back(due, k)

    def _tick(self, agent: Agent) -> None:
        # never ahead of the sampler's own schedule (the monotonic and wall clocks drift)
        agent.tick(max(agent.clock(), agent.sampler.next_due()))

    def _push(self, agent: Agent) -> None:
        t0 = time.perf_counter()
        agent.push_once()
        if agent.push_soon.is_set():  # its Ack started or stopped a copy: report that now
            agent.push_soon.clear()
            agent.push_once()
        self._push_ms.append((time.perf_counter() - t0) * 1000.0)

    def run(self, stop: threading.Event, duration_s: float | None = None) -> FleetStats:
        """Run until ``stop`` is set or ``duration_s`` passed; flushes and closes."""
        self.start()
        try:
            stop.wait(duration_s)
        finally:
            self.stop()
        return self.stats()

    def stop(self, *, flush: bool = True, close_wait_s: float = 2.0) -> None:
        """Stop the threads, push what was sampled since the last push (``flush``), and close
        every agent; waits at most ``close_wait_s`` in all for NVML calls still running. A
        second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        for s in self._schedules:
            with s.cond:
                s.cond.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        # a push thread still inside push_once (a slow controller) would race the flush on the
        # same agent's sequence numbers and spool: flush only once every thread has ended, and
        # give it one deadline for the whole fleet
        if flush and not any(t.is_alive() for t in self._threads):
            end = time.monotonic() + 2 * self.config.push_timeout_s
            for agent in self.agents:
                if time.monotonic() >= end:
                    break
                if agent.pusher is not None and agent.pusher.retry_at <= agent.clock():
                    agent.push_once()
        self.validations.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + close_wait_s
        for agent in self.agents:
            agent.close(wait_s=max(0.0, deadline - time.monotonic()))
        self.calls.close()
        self.client.close()

    # ----- figures ---------------------------------------------------------------------------
    def stats(self) -> FleetStats:
        acked = errors = throttled = spooled = samples = gpus = 0
        for a in self.agents:
            gpus += len(a.sampler.gpus)
            samples += sum(g.fast.count for g in a.sampler.gpus)
            p = a.pusher
            if p is not None:
                acked += p.stats.acked
                errors += p.stats.retryable_failures - p.stats.throttled + p.stats.rejected
                errors += a.push_errors
                throttled += p.stats.throttled
                spooled += len(p.spool)
        lat = sorted(self._push_ms)

        def pct(q: float) -> float | None:
            return (
                round(lat[min(len(lat) - 1, round(q / 100 * (len(lat) - 1)))], 2) if lat else None
            )

        return FleetStats(
            nodes=len(self.agents),
            gpus=gpus,
            gpu_samples=samples,
            batches_acked=acked,
            errors=errors,
            throttled=throttled,
            spooled=spooled,
            late_rounds=sum(s.late for s in self._schedules),
            push_p50_ms=pct(50),
            push_p99_ms=pct(99),
        )


def open_backends(sim: str | None, seed: int, default_sim: str) -> tuple[str, list[Any], Any]:
    """This machine's GPUs when NVML finds some (and no ``sim`` spec was given), else the
    simulated fleet ``sim`` (or ``default_sim``) with its demo loads: (source, backends,
    the `SimFleet` or None)."""
    from gpufleet.devices.discovery import open_local_nvml, open_sim

    if not sim:
        try:
            fleet = open_local_nvml()
            return "nvml", list(fleet.backends), None
        except Exception:  # no GPU or a broken driver must not stop the demo from starting
            sim = default_sim
    fleet = open_sim(sim, seed=seed)
    fleet.sim.demo_activity()
    return "sim", list(fleet.backends), fleet.sim


def sim_reloader(spec: str | None, sim: Any) -> Callable[[str], None] | None:
    """For a simulated fleet read from a file: re-read a node's versions and new faults from
    that file (the simulator's update command rewrites it) before its agent reopens."""
    from pathlib import Path as _Path

    if sim is None or not spec or not _Path(spec).is_file():
        return None
    from gpufleet.devices.sim import parse_fleet_spec

    def reload(node: str) -> None:
        sim.reload_node(node, parse_fleet_spec(spec))

    return reload


def job_runners(
    backends: Sequence[GpuBackend], sim: Any, root: Path, lease_s: float = DEFAULT_LEASE_S
) -> dict[str, AgentJobs]:
    """A job runner (`AgentJobs`) per node: simulated nodes run simulated jobs that load their
    GPUs (``SimExecutor`` over the `SimFleet` ``sim``), this machine's GPUs run processes
    (``LocalProcessExecutor`` under ``root``). Their GPUs come from each agent's sampler once
    it identified them (no NVML call here, so a hung GPU cannot block the start)."""
    from gpufleet.schedulers.embedded import LocalProcessExecutor, SimExecutor
    from gpufleet.schedulers.embedded.executor import JobExecutor

    executor: JobExecutor = (
        SimExecutor(sim, lease_s=lease_s) if sim is not None else LocalProcessExecutor(root=root)
    )
    return {b.node_name: AgentJobs(b.node_name, executor, lease_s=lease_s) for b in backends}
