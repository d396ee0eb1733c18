"""The figures guard's measuring side (``benchmarks/guard.py`` runs the measurements and judges
them): the guard's children (`Ctx`, `Child`: each in a session of its own, dying with the guard),
the CPU and RSS readers of a live process, the agent and the controller started for real, each
figure's ``measure_*`` function, and the registry of them in the order they run.

How each figure is measured, and why so: ``benchmarks/guard.py``'s docstring.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.guard_plants import write_plant

ROOT = Path(__file__).resolve().parents[1]

CLI_REPEATS = 3
AGENT_WARMUP_S = 3.0
AGENT_WINDOW_S = 10.0
INGEST_NODES = 24
INGEST_CONNECTIONS = 8
INGEST_BATCHES = 300
FLEET_NODES = 10_000
DASHBOARD_ROUNDS = 10
IDLE_WINDOW_S = 1.5
# the overview's calls as app.js and overview.js make them in a 1440 x 900 window (a cell
# budget of about 14,000 GPUs: past it the heatmap comes as rack groups), in their order
DASHBOARD_CALLS = (
    "/api/v1/whoami",
    "/api/v1/summary",
    "/api/v1/heatmap?metric=gpu_util_pct&group_by=rack&max_cells=14000",
    "/api/v1/nodes?attention=true&sort=attention&gpus=false&limit=200",
    "/api/v1/summary",
    "/api/v1/findings?active=true&limit=2000",
)
# no node goes lost while the guard measures: the longest heartbeat interval the wire allows
FLEET_HEARTBEAT_S = 3600.0
# nodes with a fail finding stay in service (no drains running behind the measurement)
FLEET_POLICY = "auto_drain_on_fail: false\nrequire_validation: false\nmax_out_fraction: 1.0\n"


class MeasureError(Exception):
    """A figure could not be measured (a child failed, timed out or answered wrongly)."""


# -- children ----------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_libc: Any = None


def _die_with_parent() -> None:
    """In the forked child, before exec: SIGKILL when the guard dies (even by SIGKILL)."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a live process, from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError as exc:
        raise MeasureError(f"process {pid} is gone ({exc.strerror})") from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_s(pid: int) -> dict[int, float] | None:
    """CPU seconds of each thread of ``pid`` so far, from its schedstat (nanoseconds on a CPU,
    where /proc/PID/stat counts clock ticks); None where the kernel does not offer it."""
    out: dict[int, float] = {}
    try:
        for entry in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                out[int(entry.name)] = int(Path(entry.path, "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return {t: ns / 1e9 for t, ns in out.items()}


def vm_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError as exc:
        raise MeasureError(f"process {pid} is gone ({exc.strerror})") from None
    raise MeasureError(f"process {pid}: no VmRSS")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 400) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""
        return " ".join(text[-n:].split())


@dataclass
class Ctx:
    """One guard run: its temporary directory, the children's environment, the children."""

    tmp: Path
    plant: str | None
    env: dict[str, str] = field(default_factory=dict)
    cli: list[str] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)
    progress: bool = False
    t0: float = field(default_factory=time.monotonic)

    def note(self, what: str) -> None:
        if self.progress:
            print(
                f"guard: {time.monotonic() - self.t0:6.1f} s  {what}", file=sys.stderr, flush=True
            )

    def __post_init__(self) -> None:
        global _libc
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        script = Path(sys.executable).with_name("gpufleet")
        self.cli = [str(script)] if script.exists() else [sys.executable, "-m", "gpufleet"]
        env = dict(os.environ)
        for k in ("GPUFLEET_AGENT_TOKEN", "GPUFLEET_TOKEN", "GPUFLEET_TOKEN_FILE"):
            env.pop(k, None)
        # A user's install has bytecode (pip compiles it; an editable install writes it on the
        # first run): with PYTHONDONTWRITEBYTECODE (set on the development machines) every CLI
        # start would compile gpufleet from source, ~0.4 s of CPU that no user pays.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        paths = [str(ROOT / "src")]  # this tree's gpufleet, whatever the venv points at
        if self.plant:
            paths.insert(0, str(write_plant(self.tmp / "plant", self.plant)))
        paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["COLUMNS"] = "100"  # the same tables and help whatever the terminal
        self.env = env
        subprocess.run(  # the bytecode of this tree's gpufleet, before any figure
            [sys.executable, "-m", "compileall", "-q", str(ROOT / "src" / "gpufleet")],
            env=env,
            stdout=subprocess.DEVNULL,
            check=False,
        )

    def spawn(self, name: str, args: Sequence[str], stdout_to_log: bool = False) -> Child:
        log = self.tmp / f"{name}-{len(self.children)}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                [*self.cli, *args],
                stdin=subprocess.DEVNULL,
                stdout=f if stdout_to_log else subprocess.DEVNULL,
                stderr=f,
                env=self.env,
                cwd=self.tmp,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # one prctl call, nothing else
            )
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def run(
        self, name: str, args: Sequence[str], timeout_s: float, ok: Sequence[int] = (0,)
    ) -> float:
        """Run a CLI command to its end: its CPU seconds (user + system, from wait4)."""
        child = self.spawn(name, args)
        timer = threading.Timer(timeout_s, lambda: _kill_group(child.proc, signal.SIGKILL))
        timer.start()
        try:
            # ended but not reaped (its id stays reserved): stragglers in its session go first
            os.waitid(os.P_PID, child.proc.pid, os.WEXITED | os.WNOWAIT)
        finally:
            timer.cancel()
        _kill_group(child.proc, signal.SIGKILL)
        _, status, usage = os.wait4(child.proc.pid, 0)
        child.proc.returncode = rc = os.waitstatus_to_exitcode(status)
        if rc not in ok:
            why = "timed out" if rc == -signal.SIGKILL else f"exited {rc}"
            raise MeasureError(f"gpufleet {' '.join(args[:2])} {why}: {child.tail()}")
        return float(usage.ru_utime + usage.ru_stime)

    def stop(self, child: Child, timeout_s: float = 20.0, kill: bool = False) -> None:
        """SIGTERM (``kill``: SIGKILL) to the child's session, SIGKILL after ``timeout_s``; then
        SIGKILL to what is left in it, before the child is reaped (until then its id cannot be
        taken by another process)."""
        if child.proc.returncode is not None:
            return
        _kill_group(child.proc, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while not _ended(child.proc.pid):
            if time.monotonic() > deadline:
                _kill_group(child.proc, signal.SIGKILL)
                deadline = math.inf
            time.sleep(0.02)
        _kill_group(child.proc, signal.SIGKILL)
        child.proc.wait()

    def close(self) -> None:
        for c in self.children:
            if c.proc.returncode is None:
                _kill_group(c.proc, signal.SIGTERM)
        for c in self.children:
            with contextlib.suppress(Exception):
                self.stop(c, 10.0)


def _ended(pid: int) -> bool:
    """Has child ``pid`` ended? (Left waitable: not reaped.)"""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# -- the measurements --------------------------------------------------------------------------

Values = dict[str, tuple[float, list[float]]]  # figure -> (value, the readings behind it)


def _median_cli(ctx: Ctx, figure: str, args: list[str]) -> Values:
    runs = [ctx.run(figure, args, timeout_s=60.0) for _ in range(CLI_REPEATS)]
    return {figure: (statistics.median(runs), runs)}


def measure_version(ctx: Ctx) -> Values:
    return _median_cli(ctx, "cli_version_cpu_s", ["--version"])


def measure_help(ctx: Ctx) -> Values:
    return _median_cli(ctx, "cli_help_cpu_s", ["--help"])


def measure_status(ctx: Ctx) -> Values:
    return _median_cli(ctx, "cli_status_sim_cpu_s", ["status", "--sim", "1x8xh100", "--json"])


def measure_validate(ctx: Ctx) -> Values:
    args = ["validate", "--sim", "128x8xh100", "--level", "1", "--json"]
    # 0 pass, 1 warn: a run that judged; 2 fail and 3 unusable are not this figure
    cpu = ctx.run("validate_l1_1024_cpu_s", args, timeout_s=300.0, ok=(0, 1))
    return {"validate_l1_1024_cpu_s": (cpu, [cpu])}


def measure_plan(ctx: Ctx) -> Values:
    spec = ctx.tmp / "plan-100k.json"  # JSON is YAML
    from benchmarks.plan_scale import spec_doc  # the same run as benchmarks/plan_scale.py

    spec.write_text(json.dumps(spec_doc(102_400)), encoding="utf-8")
    args = ["plan", str(spec), "--json"]
    args += ["--cable-map", str(ctx.tmp / "cables.csv"), "--bom", str(ctx.tmp / "bom.csv")]
    # 0 a plan, 1 a plan with warnings (the spec forces liquid cooling on an air-cooled DGX,
    # which the planner now warns about): both are the whole plan written; 2 is bad input
    cpu = ctx.run("plan_100k_cpu_s", args, timeout_s=120.0, ok=(0, 1))
    (ctx.tmp / "cables.csv").unlink(missing_ok=True)  # ~70 MB
    return {"plan_100k_cpu_s": (cpu, [cpu])}


def _wait(what: str, ready: Callable[[], bool], timeout_s: float, child: Child) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if child.proc.poll() is not None:
            raise MeasureError(f"{what}: exited {child.proc.returncode}: {child.tail()}")
        if time.monotonic() > deadline:
            raise MeasureError(f"{what}: not ready after {timeout_s:.0f} s: {child.tail()}")
        time.sleep(0.05)


def _http_ok(port: int, path: str) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_agent(ctx: Ctx) -> Child:
    state = ctx.tmp / "agent-state"
    args = ["agent", "--sim", "1x8xh100", "--listen", "127.0.0.1:0", "--state-dir", str(state)]
    args += ["--fast-interval", "1", "--log-level", "warning"]
    return ctx.spawn("agent", args, stdout_to_log=True)


def finish_agent(ctx: Ctx, agent: Child) -> Values:
    """Once the agent answers: a warm-up, then its CPU over the window (the sum of its threads'
    run times, in ns, from /proc/PID/task/*/schedstat when no thread came or went; else
    utime + stime from /proc/PID/stat, in clock ticks: 4 or 5 of them in 10 s here)."""

    def listening() -> bool:  # "gpufleet agent on NODE: 8 GPUs, http://127.0.0.1:PORT/metrics"
        text = agent.log.read_text(encoding="utf-8", errors="replace")
        _, sep, rest = text.partition("http://127.0.0.1:")
        return bool(sep and "/" in rest) and _http_ok(int(rest.split("/", 1)[0]), "/healthz")

    pid = agent.proc.pid
    _wait("gpufleet agent", listening, 90.0, agent)
    time.sleep(AGENT_WARMUP_S)
    c0, t0, w0 = proc_cpu_s(pid), threads_cpu_s(pid), time.monotonic()
    time.sleep(AGENT_WINDOW_S)
    c1, t1, w1 = proc_cpu_s(pid), threads_cpu_s(pid), time.monotonic()
    rss = vm_rss_kib(pid) / 1024
    ctx.stop(agent)
    if t0 is not None and t1 is not None and set(t0) == set(t1):
        cpu = sum(t1.values()) - sum(t0.values())
    else:
        cpu = c1 - c0
    pct = cpu / (w1 - w0) * 100
    return {
        "agent_cpu_pct_8gpu_1hz": (pct, [round((c1 - c0) / (w1 - w0) * 100, 3)]),
        "agent_rss_mib": (rss, [rss]),
    }


def _gpufleet_importable() -> None:
    """This tree's gpufleet and benchmarks for the guard's own setup work."""
    for p in (str(ROOT), str(ROOT / "src")):
        if p not in sys.path:
            sys.path.insert(0, p)


def _tokens(data_dir: Path, wanted: dict[str, str]) -> dict[str, str]:
    """``{label: role}`` tokens written into ``data_dir``'s database (migrated if new)."""
    from gpufleet.testing.procs import create_tokens

    return create_tokens(data_dir, {k: (role, None) for k, role in wanted.items()})


def _controller(ctx: Ctx, name: str, data_dir: Path, *extra: str) -> tuple[Child, int]:
    port = free_port()
    args = ["controller", "--data-dir", str(data_dir), "--port", str(port), *extra]
    return ctx.spawn(name, args, stdout_to_log=True), port


async def _push(port: int, token: str, lanes: list[list[bytes]]) -> dict[int, int]:
    """Each lane's bodies POSTed in order to /api/v1/ingest over its own keep-alive connection
    (429: wait, send again); counts of the answers' status codes."""
    import asyncio

    from benchmarks.ingest import Connection

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    codes: dict[int, int] = {}

    async def lane(bodies: list[bytes]) -> None:
        conn = Connection("127.0.0.1", port)
        for body in bodies:
            while True:
                status, _ = await conn.request("/api/v1/ingest", body, headers)
                if status != 429:
                    break
                await asyncio.sleep(0.2)
            codes[status] = codes.get(status, 0) + 1

    await asyncio.gather(*(lane(b) for b in lanes))
    return codes


def _push_all(port: int, token: str, lanes: list[list[bytes]], what: str) -> None:
    import asyncio

    try:
        codes = asyncio.run(_push(port, token, lanes))
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise MeasureError(f"{what}: the controller broke the connection ({exc!r})") from None
    bad = {c: n for c, n in codes.items() if c != 200}
    if bad:
        raise MeasureError(f"{what}: answers other than 200: {bad}")


def measure_ingest(ctx: Ctx) -> Values:
    _gpufleet_importable()
    from benchmarks.ingest import render_pool

    data = ctx.tmp / "ingest"
    data.mkdir()
    token = _tokens(data, {"agent": "agent"})["agent"]
    ctl, port = _controller(ctx, "controller-ingest", data)
    pool = render_pool(INGEST_NODES, 8, 5)  # while the controller starts
    _wait("gpufleet controller", lambda: _http_ok(port, "/api/v1/health"), 120.0, ctl)

    def encoded(body: dict[str, Any], seq: int) -> bytes:
        b = dict(body, seq=seq)
        if seq > 1:
            b.pop("devices", None)
        return json.dumps(b, separators=(",", ":")).encode()

    per_lane = math.ceil(INGEST_BATCHES / INGEST_CONNECTIONS)
    per_node = math.ceil(per_lane * INGEST_CONNECTIONS / INGEST_NODES)
    warm: list[list[bytes]] = [[] for _ in range(INGEST_CONNECTIONS)]
    timed: list[list[bytes]] = [[] for _ in range(INGEST_CONNECTIONS)]
    for i, (_, _, body) in enumerate(pool):  # a lane owns its nodes: their seqs go in order
        warm[i % INGEST_CONNECTIONS] += [encoded(body, 1), encoded(body, 2)]
        timed[i % INGEST_CONNECTIONS] += [encoded(body, 3 + k) for k in range(per_node)]
    timed = [lane[:per_lane] for lane in timed]
    n = sum(len(lane) for lane in timed)
    _push_all(port, token, warm, "registration")
    c0 = proc_cpu_s(ctl.proc.pid)
    _push_all(port, token, timed, "batches")
    c1 = proc_cpu_s(ctl.proc.pid)
    ctx.stop(ctl)
    ms = (c1 - c0) * 1000 / n
    return {"controller_cpu_ms_per_batch": (ms, [ms])}


def _dashboard_round(port: int, token: str) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120.0)
    try:
        for path in DASHBOARD_CALLS:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise MeasureError(f"GET {path.split('?')[0]}: HTTP {r.status}")
    except (OSError, http.client.HTTPException) as exc:
        raise MeasureError(f"dashboard calls: {exc!r}") from None
    finally:
        conn.close()


def _bulk_register(data_dir: Path, names: list[str], now: float) -> None:
    """``names`` into the database as registered nodes in service, racks of 16 (bulk inserts,
    no controller running), with the longest heartbeat interval."""
    import logging

    from sqlalchemy import update

    from gpufleet.control.db.models import Node
    from gpufleet.control.service import ControlService, ServiceConfig
    from gpufleet.control.state.remediation import RemediationPolicy
    from gpufleet.testing import bulkfleet

    logging.getLogger("gpufleet").setLevel(logging.ERROR)
    policy = RemediationPolicy(auto_drain_on_fail=False, require_validation=False)
    svc = ControlService(ServiceConfig(data_dir=data_dir, policy=policy))
    svc.ingest.start()
    try:
        store = svc.store
        bulkfleet.register(store, names, now, racks_of=16)

        def slow_heartbeats() -> None:
            with store.sessions.begin() as s:
                s.execute(update(Node).values(heartbeat_interval_s=FLEET_HEARTBEAT_S))

        store.writer.call(slow_heartbeats)
    finally:
        svc.ingest.stop()
        svc.engine.dispose()


def measure_fleet(ctx: Ctx) -> Values:
    _gpufleet_importable()
    import random

    data = ctx.tmp / "fleet"
    data.mkdir()
    policy = ctx.tmp / "fleet-policy.yaml"
    policy.write_text(FLEET_POLICY, encoding="utf-8")
    tokens = _tokens(data, {"agent": "agent", "viewer": "viewer"})
    extra = ("--policy", str(policy), "--max-nodes-per-token", "0")

    ctl, port = _controller(ctx, "controller-empty", data, *extra)
    _wait("gpufleet controller", lambda: _http_ok(port, "/api/v1/health"), 120.0, ctl)
    _dashboard_round(port, tokens["viewer"])
    time.sleep(0.5)
    rss0 = vm_rss_kib(ctl.proc.pid)
    ctx.stop(ctl, kill=True)  # SQLite in WAL mode: nothing lost; the lock is an flock
    ctx.note(f"empty controller: {rss0 / 1024:.0f} MiB; registering {FLEET_NODES:,} nodes in bulk")

    names = [f"gpu-{i:05d}" for i in range(FLEET_NODES)]
    _bulk_register(data, names, time.time())
    ctl, port = _controller(ctx, "controller-fleet", data, *extra)
    from gpufleet.testing.bulkfleet import node_batch

    rng, now = random.Random(7), time.time()
    lanes: list[list[bytes]] = [[] for _ in range(16)]
    for i, name in enumerate(names):
        body = node_batch(name, rng, now, fail=i % 100 == 7, devices=False)
        body["heartbeat_interval_s"] = FLEET_HEARTBEAT_S
        lanes[i % len(lanes)].append(json.dumps(body, separators=(",", ":")).encode())
    _wait("gpufleet controller", lambda: _http_ok(port, "/api/v1/health"), 180.0, ctl)
    ctx.note(f"controller up on {FLEET_NODES:,} nodes; pushing one telemetry batch each")
    _push_all(port, tokens["agent"], lanes, "telemetry")
    ctx.note("telemetry in; the dashboard's calls")
    _dashboard_round(port, tokens["viewer"])  # warm: first calls build caches

    pid = ctl.proc.pid
    i0, q0, wq0 = proc_cpu_s(pid), threads_cpu_s(pid), time.monotonic()
    time.sleep(IDLE_WINDOW_S)  # no request: which threads work by themselves
    i1, q1, wq1 = proc_cpu_s(pid), threads_cpu_s(pid), time.monotonic()
    for _ in range(DASHBOARD_ROUNDS):
        _dashboard_round(port, tokens["viewer"])
    c1, t1, w1 = proc_cpu_s(pid), threads_cpu_s(pid), time.monotonic()
    rss1 = vm_rss_kib(pid)
    ctx.stop(ctl, kill=True)  # its final flush of 80,000 GPUs' rollups is not measured
    whole = (c1 - i1) * 1000 / DASHBOARD_ROUNDS
    if q0 is not None and q1 is not None and t1 is not None:
        # the threads that serve: the event loop (the main thread) and the threads idle while
        # no request came (the endpoints' worker threads) or started since
        quiet = {t for t, cpu in q1.items() if cpu - q0.get(t, 0.0) < 0.0005}
        serving = [t for t in t1 if t == pid or t in quiet or t not in q1]
        ms = sum(t1[t] - q1.get(t, 0.0) for t in serving) * 1000 / DASHBOARD_ROUNDS
    else:  # the whole process, less its idle rate over the same time
        idle = (i1 - i0) / (wq1 - wq0) * (w1 - wq1)
        ms = max(0.0, (c1 - i1) - idle) * 1000 / DASHBOARD_ROUNDS
    per_node = (rss1 - rss0) / FLEET_NODES
    return {
        "dashboard_api_cpu_ms_10k": (ms, [whole]),
        "controller_rss_kib_per_node": (per_node, [rss0, rss1]),
    }


# measurement -> the figures it gives, in order; the agent (figures AGENT) runs alongside the
# first ones (one CLI process at a time, so a core is free): 15 s less for the whole guard
AGENT = ("agent_cpu_pct_8gpu_1hz", "agent_rss_mib")
ALONGSIDE_AGENT: list[tuple[Callable[[Ctx], Values], tuple[str, ...]]] = [
    (measure_version, ("cli_version_cpu_s",)),
    (measure_help, ("cli_help_cpu_s",)),
    (measure_status, ("cli_status_sim_cpu_s",)),
    (measure_validate, ("validate_l1_1024_cpu_s",)),
]
AFTER_AGENT: list[tuple[Callable[[Ctx], Values], tuple[str, ...]]] = [
    (measure_ingest, ("controller_cpu_ms_per_batch",)),
    (measure_plan, ("plan_100k_cpu_s",)),
    (measure_fleet, ("dashboard_api_cpu_ms_10k", "controller_rss_kib_per_node")),
]
