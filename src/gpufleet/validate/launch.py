"""How the ranks of a multi-node validation are started: Slurm (``srun``), ssh, or local
processes (each with its own fake node name, for tests and single-host rehearsals).

Every launcher turns one :class:`LaunchSpec` into argument lists (:meth:`Launcher.commands`,
pure and testable) and runs them through an injected :data:`Runner`. Ranks find each other with
``torch.distributed``'s ``env://`` rendezvous (``MASTER_ADDR``/``MASTER_PORT``, PyTorch
"Distributed communication package", "Environment variable initialization").

- ``SlurmLauncher``: one ``srun --nodes=N --ntasks-per-node=R`` step; each task reads its rank
  from ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` and its node from ``SLURMD_NODENAME``
  (srun(1), "OUTPUT ENVIRONMENT VARIABLES"). ``MASTER_ADDR`` is the allocation's first host.
- ``SshLauncher``: one ``ssh HOST CMD`` per host; the worker on each host starts its R local
  ranks (``--nproc-per-node``). No shell string is built locally: the remote command is a list
  quoted with ``shlex.quote`` (ssh(1) sends the remote command to the remote shell).
- ``LocalLauncher``: one local process per fake node, the same per-node command as ssh without
  ssh; gloo is bound to the loopback interface.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from gpufleet.errors import GpufleetError, UsageError

WORKER_MODULE = "gpufleet.validate.multinode"
# Set by the local launcher: the ranks rendezvous through this file (torch's ``file://`` init
# method) instead of MASTER_ADDR:MASTER_PORT.
RENDEZVOUS_FILE_ENV = "GPUFLEET_RENDEZVOUS_FILE"


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: hosts, ranks per host, the worker's arguments and the rendezvous."""

    hosts: tuple[str, ...]
    ranks_per_node: int = 1
    worker_args: tuple[str, ...] = ()
    master_addr: str | None = None  # default: the first host
    master_port: int = 29500
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every rank

    def __post_init__(self) -> None:
        if len(self.hosts) < 2:
            raise UsageError(f"multi-node validation needs at least 2 hosts, got {self.hosts}")
        if len(set(self.hosts)) != len(self.hosts):
            raise UsageError(f"hosts {list(self.hosts)}: a host appears twice")
        if self.ranks_per_node < 1:
            raise UsageError(f"--ranks-per-node {self.ranks_per_node}: must be at least 1")
        if not 0 < self.master_port < 65536:
            raise UsageError(f"master port {self.master_port}: not a TCP port")

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.ranks_per_node

    @property
    def rendezvous_addr(self) -> str:
        return self.master_addr or self.hosts[0]

    def rendezvous_env(self) -> dict[str, str]:
        return {
            "MASTER_ADDR": self.rendezvous_addr,
            "MASTER_PORT": str(self.master_port),
            **dict(self.env),
        }


@dataclass(frozen=True)
class LaunchCommand:
    """One local process to start: its argument list and the environment it adds."""

    label: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ProcessOutcome:
    """How one launched process ended."""

    label: str
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str


# Runs commands concurrently and returns their outcomes (injected; tests pass a fake).
Runner = Callable[[Sequence[LaunchCommand], float], list[ProcessOutcome]]


class Launcher(Protocol):
    """Starts the ranks of one multi-node run."""

    name: str

    def commands(self, spec: LaunchSpec) -> list[LaunchCommand]: ...

    def run(self, spec: LaunchSpec, timeout_s: float) -> list[ProcessOutcome]: ...


def node_worker_args(spec: LaunchSpec, node_rank: int) -> list[str]:
    """Arguments of the per-node worker (ssh and local launchers): it starts R local ranks."""
    return [
        "--nnodes",
        str(len(spec.hosts)),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(spec.ranks_per_node),
        *spec.worker_args,
    ]


@dataclass
class SlurmLauncher:
    """One ``srun`` job step over the hosts (inside an allocation: ``salloc``/``sbatch``)."""

    srun: str = "srun"
    python: str = sys.executable
    extra_args: tuple[str, ...] = ()
    runner: Runner | None = None
    name: str = "slurm"

    def commands(self, spec: LaunchSpec) -> list[LaunchCommand]:
        n = len(spec.hosts)
        argv = (
            self.srun,
            f"--nodes={n}",
            f"--ntasks={spec.world_size}",
            f"--ntasks-per-node={spec.ranks_per_node}",
            f"--nodelist={','.join(spec.hosts)}",
            "--kill-on-bad-exit=1",
            "--export=ALL",
            "--job-name=gpufleet-validate",
            *self.extra_args,
            self.python,
            "-m",
            WORKER_MODULE,
            *spec.worker_args,
        )
        return [LaunchCommand("srun", argv, tuple(spec.rendezvous_env().items()))]

    def run(self, spec: LaunchSpec, timeout_s: float) -> list[ProcessOutcome]:
        return (self.runner or run_processes)(self.commands(spec), timeout_s)


@dataclass
class SshLauncher:
    """One ``ssh`` per host (argument lists, no local shell); ``ssh`` binary and options are
    configurable (e.g. ``("-o", "BatchMode=yes", "-p", "2222")``)."""

    ssh: str = "ssh"
    options: tuple[str, ...] = ("-o", "BatchMode=yes")
    python: str = "python3"
    runner: Runner | None = None
    name: str = "ssh"

    def commands(self, spec: LaunchSpec) -> list[LaunchCommand]:
        out = []
        for k, host in enumerate(spec.hosts):
            env = {**spec.rendezvous_env(), "GPUFLEET_NODE_NAME": host}
            remote = [
                "env",
                *(f"{key}={val}" for key, val in env.items()),
                self.python,
                "-m",
                WORKER_MODULE,
                *node_worker_args(spec, k),
            ]
            remote_cmd = " ".join(shlex.quote(a) for a in remote)
            out.append(LaunchCommand(host, (self.ssh, *self.options, host, remote_cmd)))
        return out

    def run(self, spec: LaunchSpec, timeout_s: float) -> list[ProcessOutcome]:
        return (self.runner or run_processes)(self.commands(spec), timeout_s)


@dataclass
class LocalLauncher:
    """Every rank on this host; each host name of the spec is a fake node (tests, rehearsal).
    gloo binds to loopback (``GLOO_SOCKET_IFNAME=lo``) and the rendezvous is 127.0.0.1."""

    python: str = sys.executable
    loopback_if: str = "lo"
    runner: Runner | None = None
    name: str = "local"

    def commands(self, spec: LaunchSpec, rendezvous_file: str | None = None) -> list[LaunchCommand]:
        out = []
        for k, host in enumerate(spec.hosts):
            env = {
                **spec.rendezvous_env(),
                "MASTER_ADDR": spec.master_addr or "127.0.0.1",
                "GPUFLEET_NODE_NAME": host,
                "GLOO_SOCKET_IFNAME": self.loopback_if,
            }
            if rendezvous_file is not None:
                env[RENDEZVOUS_FILE_ENV] = rendezvous_file
            argv = (self.python, "-m", WORKER_MODULE, *node_worker_args(spec, k))
            out.append(LaunchCommand(host, argv, tuple(env.items())))
        return out

    def run(self, spec: LaunchSpec, timeout_s: float) -> list[ProcessOutcome]:
        """Every rank meets through a file store in a private temporary directory, not a TCP
        port: a port picked free and handed to the ranks could be taken by another process
        before rank 0 bound it (bind, close, reuse)."""
        with tempfile.TemporaryDirectory(prefix="gpufleet-rendezvous-") as tmp:
            store = os.path.join(tmp, "store")
            return (self.runner or run_processes)(self.commands(spec, store), timeout_s)


LAUNCHERS: dict[str, Callable[[], Launcher]] = {
    "slurm": SlurmLauncher,
    "ssh": SshLauncher,
    "local": LocalLauncher,
}


def make_launcher(name: str) -> Launcher:
    """The launcher registered under ``name``."""
    if name not in LAUNCHERS:
        from gpufleet.errors import UnknownNameError

        raise UnknownNameError("launcher", name, list(LAUNCHERS))
    return LAUNCHERS[name]()


#: torch.distributed's customary rendezvous port, where nothing better is known
DEFAULT_MASTER_PORT = 29500


def slurm_port(job_id: str | None) -> int:
    """A rendezvous port from the Slurm job id (20000-39999), so every task of one job agrees
    without talking first and two jobs sharing a first node rarely collide; outside a job,
    torch's default (a port "free here now" would say nothing of the allocation's first host,
    where the rendezvous listens, and another process could take it before torch binds)."""
    if job_id and job_id.isdigit():
        return 20000 + int(job_id) % 20000
    return DEFAULT_MASTER_PORT


# ----- the default runner: real processes -----------------------------------------------------
def run_processes(
    commands: Sequence[LaunchCommand], timeout_s: float, grace_s: float = 5.0
) -> list[ProcessOutcome]:
    """Start every command at once, wait for all; when one fails the rest get ``grace_s`` to
    finish, and at the deadline what still runs is killed (its whole process group)."""
    files: list[tuple[IO[bytes], IO[bytes]]] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for c in commands:
            out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _read)
            err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
            files.append((out, err))
            try:
                procs.append(
                    subprocess.Popen(
                        list(c.argv),
                        env={**os.environ, **dict(c.env)},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                    )
                )
            except OSError as exc:
                raise GpufleetError(f"cannot start {c.argv[0]!r} for {c.label}: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if all(rc is not None for rc in codes):
                break
            if any(rc not in (None, 0) for rc in codes):
                deadline = min(deadline, time.monotonic() + grace_s)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
    outcomes = []
    for c, p, (out, err) in zip(commands, procs, files, strict=True):
        rc = p.returncode if p.returncode is not None and p.returncode >= 0 else None
        outcomes.append(ProcessOutcome(c.label, rc, _read(out), _read(err)))
    return outcomes


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # the group run_processes started for p
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=5)


def _read(fh: IO[bytes]) -> str:
    fh.seek(0)
    data = fh.read()
    fh.close()
    return data.decode(errors="replace")


__all__ = [
    "LAUNCHERS",
    "LaunchCommand",
    "LaunchSpec",
    "Launcher",
    "LocalLauncher",
    "ProcessOutcome",
    "Runner",
    "SlurmLauncher",
    "SshLauncher",
    "make_launcher",
    "run_processes",
    "slurm_port",
]
