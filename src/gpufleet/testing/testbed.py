"""A whole gpufleet on loopback, for end-to-end tests and the failover benchmark.

``Controller`` runs a real controller (``ControlService`` + the REST API under uvicorn, in
threads) with a scheduler plugged in (a name from `gpufleet.schedulers.registry`, or a
backend); ``Agents`` runs the real agent of every node of a ``SimFleet``
(`gpufleet.agent.fleet.FleetDriver`, pushing over HTTP like ``gpufleet sim-fleet``; with
``run_jobs`` each runs the jobs the controller sends through ``AgentJobs`` + ``SimExecutor``).
The controller can be stopped and started again on the same database and port, which is how
the restart tests and the chaos runs cut it mid-stream.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import Fault, FaultKind, SimFleet
from gpufleet.errors import GpufleetError
from gpufleet.schedulers.base import SchedulerBackend
from gpufleet.testing.timescale import scaled

# Ports for daemons that must be told theirs before they start (a controller restarted on the
# same port, PostgreSQL, Prometheus): each pytest-xdist worker takes them from its own block
# below the kernel's ephemeral range. A port the kernel picked (bind to 0, close, hand over)
# could be picked again for another socket before the daemon bound it; the kernel never hands
# out ports below its ephemeral range, and no two workers share a block.
PORT_BLOCKS_FROM = 10_000
PORT_BLOCK_SIZE = 1_250
PORT_BLOCKS = 8  # 10000-19999: below the Slurm dev cluster's 20000-60000
_next_port: dict[int, int] = {}
_port_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(worker) % PORT_BLOCKS if worker.isdigit() else 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port no other test worker and no kernel-picked socket will take: the
    next bindable one of this worker's block (see `PORT_BLOCKS_FROM`); where the kernel's
    ephemeral range starts too low for the blocks, one the kernel picks."""
    block = _worker_index()
    lo = PORT_BLOCKS_FROM + block * PORT_BLOCK_SIZE
    if lo + PORT_BLOCK_SIZE > _ephemeral_low():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    with _port_lock:
        for _ in range(PORT_BLOCK_SIZE):
            offset = _next_port.get(block, os.getpid() % PORT_BLOCK_SIZE)
            _next_port[block] = (offset + 1) % PORT_BLOCK_SIZE
            if _bindable(lo + offset):
                return lo + offset
    raise GpufleetError(f"no free port in {lo}-{lo + PORT_BLOCK_SIZE - 1}")


@dataclass
class Agents:
    """The real agents of a ``SimFleet``'s nodes pushing to a controller (a `FleetDriver`)."""

    url: str
    token: str  # for nodes without their own token in ``tokens``
    fleet: SimFleet
    run_jobs: bool = True
    # node -> agent token bound to it (`Controller.node_tokens`): only these offer job slots
    tokens: dict[str, str] = field(default_factory=dict)
    lease_s: float = 30.0
    sample_interval_s: float = 0.2
    push_interval_s: float = 0.4
    heartbeat_interval_s: float = 1.0
    driver: Any = None
    executor: Any = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def agents(self) -> list[Any]:
        """The `gpufleet.agent.runner.Agent` of each node, in the fleet's order."""
        return list(self.driver.agents) if self.driver is not None else []

    def start(self) -> Agents:
        from gpufleet.agent.fleet import FleetConfig, FleetDriver
        from gpufleet.agent.jobs import AgentJobs
        from gpufleet.schedulers.embedded import SimExecutor

        self.executor = SimExecutor(self.fleet, lease_s=self.lease_s)
        backends = self.fleet.backends()
        jobs = {
            b.node_name: AgentJobs(b.node_name, self.executor, lease_s=self.lease_s)
            for b in backends
            if self.run_jobs
        }
        self._tmp = tempfile.TemporaryDirectory(prefix="gpufleet-testbed-")
        cfg = FleetConfig(
            controller=self.url,
            token=self.token,
            tokens=dict(self.tokens),
            state_dir=Path(self._tmp.name),
            fast_interval_s=self.sample_interval_s,
            push_interval_s=self.push_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
        )
        self.driver = FleetDriver(backends, cfg, jobs=jobs).start()
        return self

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.stop(flush=False)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def inject_xid79(self, node: str, gpu: int) -> float:
        """The GPU falls off the bus now (XID 79); returns the fleet-clock time of the fault."""
        g = self.fleet.node(node).gpus[gpu]
        now = self.fleet.clock()
        self.fleet.inject(Fault(FaultKind.FALLEN_OFF_BUS, node=node, gpu=gpu, at_s=now - g.t0))
        return now

    def running_copies(self) -> list[tuple[str, int, str]]:
        """(job id, generation, node) of every copy the simulated agents run now."""
        ex = self.executor
        return [k for k, c in list(ex.copies.items()) if c.stopped_s is None]


@dataclass
class Controller:
    """A real controller on loopback; ``stop()`` and ``start()`` again keep database and port."""

    data_dir: Path
    scheduler: str | SchedulerBackend = "embedded"  # a name: a fresh backend at every start
    db_url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # SchedulerOptions fields
    port: int = field(default_factory=free_port)
    tick_s: float = 0.2
    lost_after_intervals: int = 3
    service: ControlService | None = None
    admin: str = ""
    _server: Any = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Controller:
        import uvicorn

        from gpufleet.control.api.app import create_app
        from gpufleet.schedulers.registry import SchedulerOptions, make_scheduler

        cfg = ServiceConfig(
            data_dir=self.data_dir,
            db_url=self.db_url,
            tick_s=self.tick_s,
            min_drain_s=1.0,
            lost_after_intervals=self.lost_after_intervals,
            policy=RemediationPolicy(max_out_fraction=1.0),
        )
        backend = (
            make_scheduler(self.scheduler, SchedulerOptions(**self.options))
            if isinstance(self.scheduler, str)
            else self.scheduler
        )
        self.service = svc = ControlService(cfg, scheduler=backend)
        svc.start()
        if not self.admin:
            self.admin, _ = svc.store.tokens.create("admin", name="testbed")
        config = uvicorn.Config(
            create_app(svc),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise GpufleetError(f"controller did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.service is not None:
            self.service.stop()
        self._server = self._thread = self.service = None

    def token(self, role: str, tenant: str | None = None, node: str | None = None) -> str:
        assert self.service is not None
        tok, _ = self.service.store.tokens.create(role, tenant=tenant, node=node)
        return tok

    def node_tokens(self, fleet: SimFleet, tenant: str | None = None) -> dict[str, str]:
        """An agent token bound to each node of ``fleet`` (what `gpufleet up` makes)."""
        return {name: self.token("agent", tenant=tenant, node=name) for name in fleet.nodes}

    def call(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        return httpx.request(method, self.url + path, headers=headers, timeout=10.0, **kw)


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.05) -> Any:
    """Poll ``cond`` until it returns something truthy; raise a clear error after the timeout
    (``timeout_s`` times `gpufleet.testing.timescale`'s factor)."""
    timeout_s = scaled(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = cond()
        except (httpx.HTTPError, GpufleetError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(step_s)


@dataclass
class UpAgents:
    """The agents of a ``SimFleet``'s nodes as `gpufleet up` runs them (`FleetDriver`, its
    push and heartbeat intervals, default lease), with jobs as real processes
    (`LocalProcessExecutor` under ``jobs_root``, what `up` runs on real GPUs): the path the
    failover test and benchmark measure. ``inject_xid79`` makes a GPU fall off the bus."""

    url: str
    token: str
    fleet: SimFleet
    state_dir: Path
    push_interval_s: float = 1.0  # `gpufleet up` with jobs (gpufleet.cli.up_run.run_up)
    heartbeat_interval_s: float = 2.0
    driver: Any = None
    # node name -> a token bound to it, as `up` makes them (only those may offer job slots)
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def jobs_root(self) -> Path:
        return self.state_dir / "jobs"

    def start(self) -> UpAgents:
        from gpufleet.agent.fleet import FleetConfig, FleetDriver, job_runners

        backends = self.fleet.backends()
        cfg = FleetConfig(
            controller=self.url,
            token=self.token,
            tokens=self.tokens,
            state_dir=self.state_dir / "agents",
            fast_interval_s=1.0,
            push_interval_s=self.push_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
        )
        runners = job_runners(backends, None, self.jobs_root)
        self.driver = FleetDriver(backends, cfg, jobs=runners).start()
        return self

    def inject_xid79(self, node: str, gpu: int) -> float:
        """The GPU falls off the bus now (XID 79); returns the fleet-clock time of the fault."""
        g = self.fleet.node(node).gpus[gpu]
        now = self.fleet.clock()
        self.fleet.inject(Fault(FaultKind.FALLEN_OFF_BUS, node=node, gpu=gpu, at_s=now - g.t0))
        return now

    def stop(self) -> None:
        """Stop the agents and kill the job processes they still run."""
        if self.driver is None:
            return
        for runner in self.driver.jobs.values():
            for rep in runner.executor.poll(runner.node):
                if rep.running:
                    runner.executor.kill(rep.job_id, rep.generation, runner.node)
        self.driver.stop(flush=False, close_wait_s=0.5)
        self.driver = None
