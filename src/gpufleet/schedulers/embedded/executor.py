"""How the embedded scheduler runs a job on a node: the ``JobExecutor`` protocol and its
``LocalProcessExecutor`` (real processes on this machine); ``SimExecutor`` lives in ``simexec``.

Fencing lives on the executor side (the node's agent): every copy of a job carries the job's
*generation* (a fence token that grows each time the job is placed). The agent refuses to start a
generation older than one it has seen, kills older copies of a job when a newer one arrives, and
``fence(node, valid)`` kills every copy the scheduler no longer considers current (called when a
lost node comes back and when a restarted scheduler reconciles). An agent that cannot reach the
scheduler for ``lease_s`` kills its own jobs, so the scheduler may start a job elsewhere once that
lease has run out even when it cannot confirm the kill.

On a node, ``LocalProcessExecutor`` puts that lease into each copy's wrapper (``runner``): the
wrapper kills its copy's whole process tree when the agent dies (a pipe only the agent holds
reaches end of file) or when the agent's lease file goes stale, so a ``kill -9`` of the agent
cannot leave a copy running past its lease. A copy stopped that way, or killed by the executor,
is reported ``fenced``: the scheduler requeues it, it never counts as the job's own failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpufleet.errors import GpufleetError
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.jobenv import job_environment


class ExecutorError(GpufleetError):
    """The executor could not start a job (bad command, unsupported request)."""


class NodeUnreachable(GpufleetError):
    """The node's agent did not answer; what runs there is unknown."""


@dataclass(frozen=True)
class Launch:
    """One copy of a job to start on one node."""

    job_id: str
    generation: int
    node: str
    gpus: tuple[int, ...]
    env: dict[str, str]
    spec: JobSpec


@dataclass(frozen=True)
class CopyReport:
    """What a node's agent says about one copy of a job."""

    job_id: str
    generation: int
    node: str
    running: bool
    exit_code: int | None = None
    reason: str = ""
    node_fault: bool = False  # it died because of the node (a GPU fell off the bus, ...)
    # False: not (yet) seen in a report of the node's agent; the executor only stands in for a
    # start it has queued (``RemoteAgentExecutor``). The scheduler keeps such a job ``starting``.
    confirmed: bool = True
    # stopped by fencing or by a kill of the agent/scheduler (lease ran out, agent died, asked
    # to): an infrastructure stop, requeued without using the job's own restarts
    fenced: bool = False


@runtime_checkable
class JobExecutor(Protocol):
    """Starts, kills and watches copies of jobs on nodes (a node agent, or a simulation)."""

    lease_s: float  # an agent cut off from the scheduler this long kills its own jobs
    # True when ``start`` only queues the start and a later report confirms it (the job stays
    # ``starting`` until then); False when ``start`` returning means the copy runs.
    confirms_starts: bool

    def start(self, launch: Launch) -> None: ...

    def kill(self, job_id: str, generation: int, node: str) -> bool:
        """Stop that copy; True when it is surely not running any more."""
        ...

    def signal_stop(
        self, job_id: str, generation: int, node: str, signal_name: str, grace_s: float
    ) -> bool:
        """A checkpoint stop: ``signal_name`` now, killed after ``grace_s`` if still running;
        True when the copy is surely not running any more (else it is on its way)."""
        ...

    def poll(self, node: str) -> list[CopyReport]:
        """Every copy the node's agent knows (running or exited); NodeUnreachable if cut off."""
        ...

    def fence(self, node: str, valid: Mapping[str, int]) -> list[CopyReport]:
        """Kill every running copy on ``node`` whose job/generation is not in ``valid``."""
        ...

    def log_path(self, job_id: str, generation: int, node: str) -> Path | None: ...


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def signal_number(name: str) -> int:
    """``USR1``/``SIGUSR1`` -> its number (signal(7)); `ExecutorError` for an unknown name."""
    full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    try:
        return int(signal.Signals[full])
    except KeyError:
        raise ExecutorError(
            f"unknown signal {name!r}", hint="a name from signal(7), e.g. USR1 or TERM"
        ) from None


def visible_devices(gpus: tuple[int, ...]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for GPU indexes (CUDA's order; see the CUDA C Programming
    Guide, "CUDA Environment Variables")."""
    return ",".join(str(i) for i in gpus)


@dataclass
class _Proc:
    launch: Launch
    dir: Path
    popen: subprocess.Popen[bytes] | None = None
    killed: bool = False


@dataclass
class LocalProcessExecutor:
    """Runs jobs as processes on this machine, one folder per copy under ``root``.

    Each copy runs under a small wrapper (``python -m gpufleet.schedulers.embedded.runner``) in
    its own session: the wrapper captures stdout and stderr to ``log`` and writes the exit status
    to ``exit``, so a later executor (another CLI call, a restarted scheduler) still learns how a
    job ended and can kill a copy by its process group.

    ``fenced=True`` (a node agent): every wrapper holds the read end of a pipe whose write end
    only this executor holds (its end of file: the agent died) and watches ``lease_file``
    (stale for more than ``lease_s``: the agent lost the control plane); either kills the copy's
    whole process tree (see ``runner``). The agent renews the lease with `renew_lease`.
    """

    root: Path
    lease_s: float = 0.0  # local: the scheduler and the processes share a machine
    fenced: bool = False  # copies die with this executor's process or with a stale lease
    confirms_starts = False  # the process runs when ``start`` returns
    kill_grace_s: float = 5.0
    python: str = sys.executable
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen
    _procs: dict[tuple[str, int, str], _Proc] = field(default_factory=dict)
    _pipe: tuple[int, int] | None = None

    @property
    def lease_file(self) -> Path:
        """The file the agent touches at every successful contact with the control plane."""
        return self.root / "lease"

    def renew_lease(self) -> None:
        """The agent heard from the control plane: its copies may run ``lease_s`` longer."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.lease_file.touch()

    def _lease_args(self) -> tuple[list[str], tuple[int, ...]]:
        """The wrapper's lease options and the descriptors it inherits."""
        if not self.fenced:
            return [], ()
        if self._pipe is None:
            self._pipe = os.pipe()  # neither end is inheritable unless passed (PEP 446)
        args = ["--lease-fd", str(self._pipe[0])]
        if self.lease_s > 0:
            if not self.lease_file.exists():
                self.renew_lease()
            args += ["--lease-file", str(self.lease_file), "--lease-s", f"{self.lease_s:g}"]
        return args, (self._pipe[0],)

    def _dir(self, job_id: str, generation: int, node: str) -> Path:
        return self.root / f"job-{job_id}" / f"gen-{generation}-{node}"

    def log_path(self, job_id: str, generation: int, node: str) -> Path | None:
        p = self._dir(job_id, generation, node) / "log"
        return p if p.exists() else None

    def start(self, launch: Launch) -> None:
        spec = launch.spec
        if spec.image:
            raise ExecutorError(
                f"job {launch.job_id}: container images are not run by the local executor",
                hint="give a command (argument list), or use the kubernetes backend",
            )
        if not spec.command:
            raise ExecutorError(f"job {launch.job_id}: no command to run")
        for known in self._scan(launch.node):
            if known.job_id == launch.job_id and known.generation > launch.generation:
                raise ExecutorError(
                    f"job {launch.job_id}: generation {launch.generation} is stale "
                    f"(generation {known.generation} exists)"
                )
            if known.job_id == launch.job_id and known.running:
                self.kill(known.job_id, known.generation, known.node)
        d = self._dir(launch.job_id, launch.generation, launch.node)
        d.mkdir(parents=True, exist_ok=True)
        (d / "launch.json").write_text(
            json.dumps({"command": list(spec.command), "gpus": list(launch.gpus)}),
            encoding="utf-8",
        )
        env = job_environment(launch.env)  # a clean environment: never the agent's secrets
        lease_args, fds = self._lease_args()
        argv = [self.python, "-m", "gpufleet.schedulers.embedded.runner", str(d), *lease_args]
        try:
            proc = self.popen(
                [*argv, "--", *spec.command],
                env=env,
                pass_fds=fds,
                cwd=spec.checkpoint_dir if spec.checkpoint_dir else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExecutorError(f"job {launch.job_id}: cannot start the wrapper: {exc}") from exc
        (d / "pid").write_text(str(proc.pid), encoding="utf-8")
        self._procs[(launch.job_id, launch.generation, launch.node)] = _Proc(launch, d, proc)

    def _pid(self, d: Path) -> int | None:
        try:
            return int((d / "pid").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _alive(self, key: tuple[str, int, str], d: Path) -> bool:
        proc = self._procs.get(key)
        if proc is not None and proc.popen is not None:
            return proc.popen.poll() is None
        pid = self._pid(d)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        cmdline = Path(f"/proc/{pid}/cmdline")
        with contextlib.suppress(OSError):
            if str(d).encode() not in cmdline.read_bytes():
                return False  # the pid was reused by something else
        return True

    def _report(self, job_id: str, generation: int, node: str, d: Path) -> CopyReport:
        key = (job_id, generation, node)
        exit_file = d / "exit"
        if exit_file.exists():
            text = exit_file.read_text(encoding="utf-8").strip()
            fence = _read(d / "fenced")
            if fence is not None:
                return CopyReport(
                    job_id, generation, node, False, None, f"fenced: {fence}", fenced=True
                )
            if (d / "killed").exists():
                why = f"killed by the agent (exit {text})"
                for name in ("checkpointed", "stop_killed"):
                    note = _read(d / name)
                    if note is not None:
                        why = f"checkpoint stop: {note} (exit {text})"
                return CopyReport(job_id, generation, node, False, None, why, fenced=True)
            code = int(text) if text.lstrip("-").isdigit() else None
            return CopyReport(job_id, generation, node, False, code, f"exit {text}")
        if self._alive(key, d):
            return CopyReport(job_id, generation, node, True)
        if (d / "killed").exists():
            return CopyReport(job_id, generation, node, False, None, "killed", fenced=True)
        return CopyReport(job_id, generation, node, False, None, "wrapper vanished")

    def _scan(self, node: str) -> list[CopyReport]:
        out: list[CopyReport] = []
        if not self.root.is_dir():
            return out
        for jdir in sorted(self.root.glob("job-*")):
            job_id = jdir.name[4:]
            for gdir in sorted(jdir.glob(f"gen-*-{node}")):
                gen_text = gdir.name[4:].split("-", 1)[0]
                if gen_text.isdigit() and gdir.name == f"gen-{gen_text}-{node}":
                    out.append(self._report(job_id, int(gen_text), node, gdir))
        return out

    def poll(self, node: str) -> list[CopyReport]:
        return self._scan(node)

    def kill(self, job_id: str, generation: int, node: str) -> bool:
        d = self._dir(job_id, generation, node)
        key = (job_id, generation, node)
        if not self._alive(key, d):
            return True
        pid = self._pid(d)
        if pid is None:
            return True
        (d / "killed").write_text("1", encoding="utf-8")
        for sig, wait_s in ((signal.SIGTERM, self.kill_grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self._alive(key, d):
                    return True
                time.sleep(0.02)
        return not self._alive(key, d)

    def signal_stop(
        self, job_id: str, generation: int, node: str, signal_name: str, grace_s: float
    ) -> bool:
        """Ask the copy's wrapper for a checkpoint stop (``DIR/stop``; see ``runner``): it
        signals the command and kills it after ``grace_s``. Returns at once; asking again is
        a no-op."""
        sig = signal_number(signal_name)
        d = self._dir(job_id, generation, node)
        if not self._alive((job_id, generation, node), d):
            return True
        if not (d / "stop").exists():
            (d / "killed").write_text("1", encoding="utf-8")
            tmp = d / "stop.tmp"
            tmp.write_text(f"{sig} {grace_s:g}", encoding="utf-8")
            os.replace(tmp, d / "stop")
        return False

    def fence(self, node: str, valid: Mapping[str, int]) -> list[CopyReport]:
        killed = []
        for rep in self._scan(node):
            if rep.running and valid.get(rep.job_id) != rep.generation:
                self.kill(rep.job_id, rep.generation, node)
                killed.append(rep)
        return killed
