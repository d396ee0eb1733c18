"""The wrapper a local job copy runs under, and its fence:
``python -m gpufleet.schedulers.embedded.runner DIR [--lease-fd N] [--lease-file F --lease-s S]
-- ARGV...``.

It sends the command's stdout and stderr to ``DIR/log`` and writes the exit status to
``DIR/exit`` (atomically, through a temporary file), so whoever asks later learns how it ended.

Fencing (issue 12, item 1): a copy must not outlive its agent's lease. The wrapper holds the
lease itself, so nothing depends on the agent staying alive:

- ``--lease-fd N``: the read end of a pipe whose write end only the agent holds. End of file
  on it means the agent died (``kill -9`` included): the copy is fenced at once.
- ``--lease-file F --lease-s S``: a file the agent touches after each successful contact with
  the control plane. When its modification time is more than ``S`` seconds old, the agent has
  been cut off from the control plane for the whole lease: the copy is fenced.

Fencing kills the whole tree, grandchildren included: on Linux the wrapper is a child subreaper
(``PR_SET_CHILD_SUBREAPER``, prctl(2)), so descendants orphaned by their parents are re-parented
to it rather than to init and stay findable; it sends SIGTERM to every descendant and to its own
session, then SIGKILL after ``TERM_GRACE_S``, and reaps them. The command itself gets
``PR_SET_PDEATHSIG`` (SIGKILL), so even a ``kill -9`` of the wrapper takes the command down.
A fenced copy leaves ``DIR/fenced`` (the reason) next to its exit status: the scheduler requeues
it instead of counting the exit as the job's own failure.

Checkpoint stops (a maintenance drain's deadline): the executor writes ``DIR/stop`` (``SIGNAL
GRACE_S``, e.g. ``10 60``); the wrapper sees it within a step, sends that signal to the command
only (its top process, as Slurm's ``--signal=B:USR1@60`` signals the batch shell: the job
decides what to forward), and kills the whole tree if the command has not exited ``GRACE_S``
seconds later. It writes ``DIR/checkpointed`` (the command exited in time) or
``DIR/stop_killed`` (it had to be killed), which the copy's report carries.

Descendants still alive when the command exits are killed too: nothing of a copy runs once it
has ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# SIGTERM, then SIGKILL; both waits together stay below the executor's kill grace (5 s), so the
# wrapper finishes its own kill before the executor would SIGKILL it
TERM_GRACE_S = 3.0
KILL_WAIT_S = 1.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> bool:
    """prctl(2) through libc; False off Linux or when the call fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:
    """In the command's process, before exec: SIGKILL when the wrapper dies."""
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _write(d: Path, name: str, text: str) -> None:
    tmp = d / f"{name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, d / name)


def _write_exit(d: Path, code: int) -> None:
    _write(d, "exit", str(code))


def _proc_table() -> dict[int, tuple[int, int, bool]]:
    """pid -> (parent pid, session id, is a zombie) of every process, from /proc/PID/stat
    (proc(5))."""
    out: dict[int, tuple[int, int, bool]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) >= 4:
                out[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0] == b"Z")
    return out


def descendants(root: int) -> set[int]:
    """Every live (not zombie) process under ``root`` by parent links or in its session,
    ``root`` left out."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _sid, _zombie) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = {pid for pid, (_ppid, sid, _z) in table.items() if sid == root}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(root)
    return {pid for pid in found if pid in table and not table[pid][2]}


def _reap(keep: int) -> None:
    """Collect the exited children of this process (orphans re-parented to this subreaper
    included), except ``keep``: its status belongs to its ``Popen``."""
    me = os.getpid()
    for pid, (ppid, _sid, zombie) in _proc_table().items():
        if ppid == me and zombie and pid != keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _gone(root: int, keep: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        _reap(keep)
        if not descendants(root):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def kill_tree(root: int, keep: int, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM every descendant of ``root``, SIGKILL what is left after ``grace_s``, reap all
    but ``keep`` (the command, waited for by its ``Popen``)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if _gone(root, keep, wait_s):
            break
    _reap(keep)


@dataclass
class CheckpointStop:
    """A checkpoint stop asked through ``DIR/stop`` (see the module docstring)."""

    dir: Path
    signalled_at: float | None = None
    grace_s: float = 0.0

    def request(self) -> tuple[int, float] | None:
        """(signal, grace) once ``DIR/stop`` holds a valid request, else None."""
        try:
            words = (self.dir / "stop").read_text(encoding="utf-8").split()
            return int(words[0]), max(0.0, float(words[1]))
        except (OSError, ValueError, IndexError):
            return None

    def check(self, child: subprocess.Popen[bytes], log: Callable[[str], None]) -> bool:
        """Signal the command when asked; True once its grace has run out (kill it now)."""
        if self.signalled_at is None:
            asked = self.request()
            if asked is None:
                return False
            sig, self.grace_s = asked
            self.signalled_at = time.monotonic()
            log(f"gpufleet: checkpoint signal {sig}; {self.grace_s:g} s to exit")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, sig)
            return False
        return time.monotonic() - self.signalled_at > self.grace_s

    def ended(self, killed: bool) -> None:
        """Record how a signalled command ended (nothing when no stop was asked)."""
        if self.signalled_at is None:
            return
        took = time.monotonic() - self.signalled_at
        if killed:
            _write(self.dir, "stop_killed", f"still running {took:.1f} s after the signal")
        else:
            _write(self.dir, "checkpointed", f"exited {took:.1f} s after the signal")


@dataclass
class Lease:
    """What the wrapper holds from its agent (see the module docstring)."""

    fd: int | None = None
    file: Path | None = None
    lease_s: float = 0.0
    agent_gone: bool = False

    def broken(self, timeout_s: float) -> str | None:
        """Wait up to ``timeout_s`` for news; the reason to fence, or None while it holds."""
        if self.fd is not None and not self.agent_gone:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    data = b""
                if not data:
                    self.agent_gone = True
        else:
            time.sleep(timeout_s)
        if self.agent_gone:
            return "the agent died"
        if self.file is not None and self.lease_s > 0:
            try:
                age = time.time() - self.file.stat().st_mtime
            except OSError:
                return f"lease file {self.file} is gone"
            if age > self.lease_s:
                return (
                    f"no contact with the control plane for {age:.1f} s (lease {self.lease_s:g} s)"
                )
        return None


def _parse(argv: list[str]) -> tuple[Path, Lease, list[str]] | None:
    if "--" not in argv:
        return None
    cut = argv.index("--")
    head, cmd = argv[:cut], argv[cut + 1 :]
    if not head or not cmd:
        return None
    lease = Lease()
    opts = head[1:]
    if len(opts) % 2:
        return None
    for flag, value in zip(opts[::2], opts[1::2], strict=True):
        try:
            if flag == "--lease-fd":
                lease.fd = int(value)
            elif flag == "--lease-file":
                lease.file = Path(value)
            elif flag == "--lease-s":
                lease.lease_s = float(value)
            else:
                return None
        except ValueError:
            return None
    return Path(head[0]), lease, cmd


def supervise(
    child: subprocess.Popen[bytes],
    lease: Lease,
    on_fence: Callable[[str], None],
    stop: CheckpointStop | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> int:
    """Wait for the command, fencing it when the lease breaks and signalling, then killing,
    it on a checkpoint stop; returns its exit status."""
    me = os.getpid()
    stop_killed = False
    step = 0.1 if lease.lease_s <= 0 else min(0.25, max(0.02, lease.lease_s / 20))
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        code = child.poll()
        if code is not None:
            break
        if stopping:
            kill_tree(me, child.pid)  # asked to stop: the command and everything it started
            continue
        if stop is not None and stop.check(child, log):
            stop_killed = True
            kill_tree(me, child.pid)  # the checkpoint grace ran out
            continue
        why = lease.broken(step) if (lease.fd is not None or lease.file) else None
        if why is None:
            if lease.fd is None and not lease.file:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(step)
            continue
        on_fence(why)
        kill_tree(me, child.pid)
    kill_tree(me, child.pid)  # what the command left behind does not outlive it
    if stop is not None:
        stop.ended(stop_killed)
    return code


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        sys.stderr.write(
            "usage: runner DIR [--lease-fd N] [--lease-file F --lease-s S] -- COMMAND [ARGS...]\n"
        )
        return 2
    d, lease, cmd = parsed
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    with open(d / "log", "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent,  # safe here: the wrapper runs no threads
            )
        except OSError as exc:
            log.write(f"gpufleet: cannot run {cmd[0]!r}: {exc}\n".encode())
            _write_exit(d, 127)
            return 127

        def fenced(why: str) -> None:
            log.write(f"gpufleet: fencing this copy: {why}\n".encode())
            _write(d, "fenced", why)

        def note(line: str) -> None:
            log.write(f"{line}\n".encode())

        code = supervise(child, lease, fenced, CheckpointStop(d), note)
    # A child killed by signal N reports -N; shells report 128+N (bash(1), "EXIT STATUS").
    _write_exit(d, 128 - code if code < 0 else code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
