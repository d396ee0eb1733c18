"""A gpufleet made of real processes, for the fencing and chaos tests and the failover benchmark.

``ControllerProcess`` runs ``python -m gpufleet controller`` (the embedded scheduler by default)
on a fixed port and data directory, so it can be ``kill -9``-ed and started again on the same
database. ``AgentProcess`` runs ``python -m gpufleet agent --sim FLEET.yaml --run-jobs
--executor process``: one simulated node whose jobs are real processes under the fencing
wrapper. ``TcpProxy`` stands between agents and the controller; ``cut()`` makes the controller
unreachable from them (a network partition: connections refused and dropped), ``heal()`` ends
it. ``heartbeat_job`` is the job the chaos test runs: a shell that starts a grandchild appending
``generation time`` lines to a file, so the test sees from the file alone which copies ran when.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.errors import GpufleetError
from gpufleet.testing.testbed import free_port, wait_for

PYTHON = sys.executable


def package_root() -> Path:
    """The directory holding the ``gpufleet`` package this process runs: a source tree's
    ``src``, or the interpreter's site-packages for an installed package."""
    import gpufleet

    return Path(gpufleet.__file__).resolve().parent.parent


def _installed_roots() -> set[Path]:
    import site

    roots = [*site.getsitepackages(), site.getusersitepackages()]
    return {Path(r).resolve() for r in roots}


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment (``base``, default this process's) with the same ``gpufleet``
    importable: a package outside the interpreter's site-packages (a work tree's ``src``,
    an editable install) goes first on ``PYTHONPATH``; an installed one needs nothing."""
    env = dict(os.environ if base is None else base)
    root = package_root()
    if root not in _installed_roots():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


def _env() -> dict[str, str]:
    """The child's environment: this process's (no agent token), with the same gpufleet."""
    env = child_env()
    env.pop("GPUFLEET_AGENT_TOKEN", None)
    return env


def _spawn(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m gpufleet ARGS``, its output to ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [PYTHON, "-m", "gpufleet", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )


def create_tokens(
    data_dir: Path | None, wanted: dict[str, tuple[str, str | None]], db_url: str | None = None
) -> dict[str, str]:
    """Tokens straight into the controller's database (migrated here if new): ``{label: (role,
    node)}`` to ``{label: token}``; one process instead of one CLI call per token."""
    from gpufleet.control.db.engine import database_url, make_engine, migrate, session_factory
    from gpufleet.control.state.auth import TokenStore

    engine = make_engine(database_url(data_dir, db_url))
    try:
        migrate(engine)
        tokens = TokenStore(session_factory(engine), time.time)
        out = {}
        for label, (role, node) in wanted.items():
            out[label], _ = tokens.create(role, name=f"procs-{label}", node=node)
        return out
    finally:
        engine.dispose()


@dataclass
class ControllerProcess:
    """``python -m gpufleet controller`` on a fixed port and database (``db_url``: a shared
    PostgreSQL, one of several replicas, with ``args`` such as ``--lease-seconds``; the data
    directory then holds only its policy and logs)."""

    data_dir: Path
    admin: str
    port: int = field(default_factory=free_port)
    scheduler: str = "embedded"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    db_url: str | None = None
    args: list[str] = field(default_factory=list)
    tls: tuple[Path, Path] | None = None  # (cert, key): serve https, reached trusting the cert
    env: dict[str, str] = field(default_factory=dict)  # on top of the tests' environment

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    _verify: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx verifies this controller with: its own certificate when it serves TLS
        (one context, made once: `ready` polls every 50 ms)."""
        if self.tls is None:
            return True
        if self._verify is None:
            self._verify = ssl.create_default_context(cafile=str(self.tls[0]))
        return self._verify

    def start(self, wait_s: float = 120.0) -> ControllerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        policy = self.data_dir / "policy.yaml"
        policy.write_text("max_out_fraction: 1.0\n", encoding="utf-8")
        self.starts += 1
        where = ("--db-url", self.db_url) if self.db_url else ("--data-dir", str(self.data_dir))
        tls = ("--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])) if self.tls else ()
        self.proc = _spawn(
            [
                *("controller", *where),
                *("--port", str(self.port), "--scheduler", self.scheduler),
                *("--policy", str(policy), *self.args),
                *tls,
            ],
            self.data_dir / f"controller-{self.starts}.log",
            {**_env(), **self.env},
        )
        wait_for(self.ready, wait_s, f"controller on port {self.port}", step_s=0.05)
        return self

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise GpufleetError(f"controller exited; see {self.data_dir}/controller-*.log")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(self.url + "/api/v1/health", timeout=2.0, verify=self.verify())
            return r.status_code == 200
        return False

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def call(self, method: str, path: str, timeout_s: float = 10.0, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin}"}
        return httpx.request(
            method, self.url + path, headers=headers, timeout=timeout_s, verify=self.verify(), **kw
        )

    def submit(self, name: str, command: list[str], **spec: Any) -> str:
        """Submit once (not idempotent: a long timeout rather than a retry on a slow machine)."""
        body = {"name": name, "command": command, **spec}
        r = self.call("POST", "/api/v1/jobs", timeout_s=60.0, json=body)
        if r.status_code != 201:
            raise GpufleetError(f"submit {name}: HTTP {r.status_code} {r.text[:300]}")
        job_id: str = r.json()["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.call("GET", f"/api/v1/jobs/{job_id}")
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def wait_ended(self, job_id: str, timeout_s: float = 240.0) -> dict[str, Any]:
        """The job's document once it reached a final state."""

        def ended() -> dict[str, Any] | None:
            doc = self.job(job_id)
            return doc if doc["state"] in ("succeeded", "failed", "cancelled") else None

        done: dict[str, Any] = wait_for(ended, timeout_s, f"job {job_id} ended", step_s=0.2)
        return done

    def wait_in_service(self, node: str, timeout_s: float = 120.0) -> None:
        """Until the node is in service with its GPUs known: the agent's validation report
        can put it in service before the first telemetry batch describes its GPUs, and what
        reads the inventory (a campaign choosing nodes by driver version) needs both."""

        def up() -> bool:
            r = self.call("GET", f"/api/v1/nodes/{node}")
            if r.status_code != 200:
                return False
            doc = r.json()["node"]
            return bool(doc["state"] == "in_service" and doc["gpus"] and doc["model"])

        wait_for(up, timeout_s, f"node {node} in service with its GPUs reported", step_s=0.2)

    def node_state(self, node: str) -> str | None:
        r = self.call("GET", f"/api/v1/nodes/{node}")
        if r.status_code != 200:
            return None
        state: str = r.json()["node"]["state"]
        return state


def fleet_yaml(
    node: str, gpus: int = 2, faults: list[dict[str, Any]] | None = None, model: str = "h100-sxm"
) -> str:
    """A one-node simulated fleet (``--sim FILE``), with scheduled faults if given."""
    doc: dict[str, Any] = {"nodes": [{"name": node, "model": model, "gpus": gpus}]}
    if faults:
        doc["faults"] = [{"node": node, **f} for f in faults]
    return json.dumps(doc)  # JSON is YAML


@dataclass
class AgentProcess:
    """``python -m gpufleet agent --sim ... --run-jobs --executor process`` for one node."""

    node: str
    controller_url: str
    token: str
    state_dir: Path
    lease_s: float = 3.0
    push_interval_s: float = 0.25
    fast_interval_s: float = 0.25  # the sampler's fast tier (a fallen GPU is seen within it)
    faults: list[dict[str, Any]] = field(default_factory=list)
    model: str = "h100-sxm"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # on top of the tests' environment

    def start(self) -> AgentProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fleet = self.state_dir / "fleet.yaml"
        text = fleet_yaml(self.node, faults=self.faults, model=self.model)
        fleet.write_text(text, encoding="utf-8")
        self.starts += 1
        self.proc = _spawn(
            [
                *("agent", "--sim", str(fleet)),
                *("--listen", "127.0.0.1:0", "--controller", self.controller_url),
                *("--state-dir", str(self.state_dir), "--run-jobs", "--executor", "process"),
                *(
                    "--job-lease",
                    f"{self.lease_s:g}",
                    "--fast-interval",
                    f"{self.fast_interval_s:g}",
                ),
                *("--push-interval", f"{self.push_interval_s:g}"),
            ],
            self.state_dir / f"agent-{self.starts}.log",
            {**_env(), **self.env, "GPUFLEET_AGENT_TOKEN": self.token},
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


def stop_all(agents: list[AgentProcess]) -> None:
    """Stop agents together: SIGTERM to all, then wait for each (one by one took seconds
    each on a loaded machine)."""
    for a in agents:
        if a.alive():
            assert a.proc is not None
            a.proc.terminate()
    for a in agents:
        a.stop()


class TcpProxy:
    """A loopback TCP forwarder to ``target_port``; ``cut()`` partitions, ``heal()`` reconnects."""

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self.heal()
        return self

    def heal(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lst.bind(("127.0.0.1", self.port))
            lst.listen(64)
            self._listener = lst
        threading.Thread(target=self._accept, args=(lst,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        with self._lock:
            lst, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if lst is not None:
            with contextlib.suppress(OSError):
                lst.shutdown(socket.SHUT_RDWR)
            lst.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def stop(self) -> None:
        self._stopped.set()
        self.cut()

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not lst:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)


def heartbeat_job(path: Path, beats: int, every_s: float = 0.1) -> list[str]:
    """A job: a shell that starts a grandchild appending ``GENERATION TIME`` every ``every_s``
    to ``path`` (``beats`` times, then ``GENERATION done``) and waits for it; exit 0.

    The grandchild is bash, whose ``$EPOCHREALTIME`` reads the clock without a fork (a ``date``
    per beat made dozens of jobs at once a load of their own); ``LC_ALL=C`` keeps its decimal
    point a dot."""
    q = shlex.quote(str(path))
    inner = (
        f"LC_ALL=C; i=0; while [ $i -lt {beats} ]; do "
        f'echo "$GPUFLEET_GENERATION $EPOCHREALTIME" >> {q}; i=$((i+1)); sleep {every_s}; '
        f'done; echo "$GPUFLEET_GENERATION done" >> {q}'
    )
    return ["sh", "-c", f"bash -c {shlex.quote(inner)} & wait"]


@dataclass(frozen=True)
class Beats:
    """One job's heartbeats: ``runs[generation] = (first, last)`` times, and who finished."""

    runs: dict[int, tuple[float, float]]
    done: tuple[int, ...]


def read_beats(path: Path) -> Beats:
    runs: dict[int, tuple[float, float]] = {}
    done: list[int] = []
    if not path.exists():
        return Beats({}, ())
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            continue  # a line cut by a kill
        gen = int(parts[0])
        if parts[1] == "done":
            done.append(gen)
            continue
        try:
            t = float(parts[1])
        except ValueError:
            continue
        first, last = runs.get(gen, (t, t))
        runs[gen] = (min(first, t), max(last, t))
    return Beats(runs, tuple(done))


def overlaps(beats: Beats) -> list[tuple[int, int]]:
    """Pairs of generations whose heartbeat intervals overlap (two copies alive at once)."""
    items = sorted(beats.runs.items())
    return [
        (g1, g2)
        for i, (g1, (a1, b1)) in enumerate(items)
        for g2, (a2, b2) in items[i + 1 :]
        if a1 <= b2 and a2 <= b1
    ]


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker`` (e.g. a heartbeat file),
    the copies' wrappers left out (their command line repeats the job's)."""
    out = []
    needle = marker.encode()
    wrapper = b"gpufleet.schedulers.embedded.runner"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        zombie = stat.rsplit(b")", 1)[1].split()[0] == b"Z"
        if needle in cmdline and wrapper not in cmdline and not zombie:
            out.append(int(entry.name))
    return out
