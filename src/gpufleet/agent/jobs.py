"""Jobs on a node: the agent side of the embedded scheduler, driven by the control plane.

The control plane's ``Ack`` carries ``commands`` (start or kill one copy of a job, with its
generation); each batch carries the agent's ``jobs`` report (its GPUs, its lease and every copy it
knows). ``AgentJobs`` runs the copies through a ``JobExecutor`` of the embedded scheduler:
``LocalProcessExecutor`` on a real node (``CUDA_VISIBLE_DEVICES``, log capture, exit status) or
``SimExecutor`` on a simulated node (the job loads the simulated GPUs).

Fencing (the generation is the fence token):
- a start whose generation is older than one the node has seen for that job is refused (the
  executor checks), and a newer one kills the older copy;
- an agent that has not heard from the control plane for ``lease_s`` kills every copy it runs
  (the control plane may then start them elsewhere without a confirmed kill). The lease counts
  from the last successful contact (an ``Ack``); ``on_contact`` passes each renewal on to the
  executor, whose per-copy wrappers hold the lease themselves (``LocalProcessExecutor`` with
  ``fenced``: a copy dies with its agent, ``kill -9`` included, and when the lease goes stale);
- the control plane kills stale copies of a node that comes back (``kill`` commands).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.executor import (
    CopyReport,
    ExecutorError,
    JobExecutor,
    Launch,
    NodeUnreachable,
)
from gpufleet.wire import WireCommand, WireJobCopy, WireJobs, WireSlot

log = logging.getLogger("gpufleet.agent.jobs")

DEFAULT_LEASE_S = 30.0  # longer than a controller restart, short enough to fail over a lost node
LOG_TAIL_BYTES = 4096
KEEP_FINISHED_S = 600.0  # how long a finished copy is still reported
# An agent that runs jobs exchanges with the control plane at least this often (its batches
# carry the jobs report; the answers carry start/kill commands), whatever its push interval:
# commands reach it and their outcome reaches the scheduler within about a second.
DEFAULT_EXCHANGE_S = 1.0


def _spec_of(cmd: WireCommand) -> JobSpec:
    if cmd.spec is None:
        raise ExecutorError(f"start of job {cmd.job_id}: the command carries no job spec")
    return cmd.spec


def slots_from_infos(infos: Iterable[tuple[int, Any]]) -> list[WireSlot]:
    """Schedulable GPUs from ``(index, DeviceInfo)`` pairs (model key from the catalog when
    known)."""
    from gpufleet.catalog import load_catalog

    cat = load_catalog()
    out = []
    for i, info in infos:
        model = info.model
        if model is None:
            found = cat.gpu_by_nvml_name(info.name)
            model = found.key if found else info.name
        out.append(WireSlot(index=i, model=model, memory_bytes=info.memory_total_bytes or 0))
    return out


@dataclass
class AgentJobs:
    """The copies of jobs one node runs, as the control plane asked."""

    node: str
    executor: JobExecutor
    # the node's GPUs, or where to ask for them at each report (the agent's sampler, so that
    # no NVML call runs here: `Agent.enable_jobs` fills it in when left empty)
    slots: Sequence[WireSlot] | Callable[[], Sequence[WireSlot]] = ()
    lease_s: float = DEFAULT_LEASE_S
    exchange_s: float = DEFAULT_EXCHANGE_S
    clock: Callable[[], float] = time.time
    keep_finished_s: float = KEEP_FINISHED_S
    last_contact_s: float = field(default=0.0)
    refused: dict[tuple[str, int], str] = field(default_factory=dict)
    # called after each contact's commands ran (renews the wrappers' lease, see the docstring)
    on_contact: Callable[[], None] | None = None
    _finished_at: dict[tuple[str, int], float] = field(default_factory=dict)
    _tails: dict[tuple[str, int], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.last_contact_s:
            self.last_contact_s = self.clock()
        if self.on_contact is not None:
            self.on_contact()  # a fresh agent starts a fresh lease

    # ----- commands from the control plane ---------------------------------------------------
    def apply(self, commands: Sequence[WireCommand]) -> bool:
        """Run the ``Ack``'s commands; an ``Ack`` also renews the lease. Returns True when a copy
        started or stopped: the agent then reports at once (the control plane waits for that
        report to start a killed job elsewhere, and to count a start as running)."""
        with self._lock:
            self.last_contact_s = self.clock()
            before = self._running() if commands else set()
            for cmd in commands:
                try:
                    if cmd.op == "start":
                        self._start(cmd)
                    elif cmd.signal:  # a checkpoint stop (a maintenance drain's deadline)
                        self.executor.signal_stop(
                            cmd.job_id, cmd.generation, self.node, cmd.signal, cmd.grace_s
                        )
                    else:
                        self.executor.kill(cmd.job_id, cmd.generation, self.node)
                except (ExecutorError, NodeUnreachable) as exc:
                    log.warning("job %s gen %d: %s", cmd.job_id, cmd.generation, exc)
                    self.refused[(cmd.job_id, cmd.generation)] = str(exc)
            if self.on_contact is not None:
                try:
                    self.on_contact()
                except OSError as exc:  # the copies then fence themselves: say why
                    log.error("cannot renew the job lease: %s", exc)
            return bool(commands) and self._running() != before

    def _running(self) -> set[tuple[str, int]]:
        try:
            return {(r.job_id, r.generation) for r in self.executor.poll(self.node) if r.running}
        except NodeUnreachable:
            return set()

    def _start(self, cmd: WireCommand) -> None:
        key = (cmd.job_id, cmd.generation)
        known = {(r.job_id, r.generation) for r in self.executor.poll(self.node)}
        if key in known or key in self.refused:
            return  # commands repeat until the report shows them: starting is idempotent
        launch = Launch(
            cmd.job_id,
            cmd.generation,
            self.node,
            tuple(cmd.gpus),
            dict(cmd.env),
            _spec_of(cmd),
        )
        self.executor.start(launch)

    # ----- lease -------------------------------------------------------------------------------
    def check_lease(self) -> list[CopyReport]:
        """Cut off from the control plane longer than the lease: kill every running copy."""
        if self.clock() - self.last_contact_s <= self.lease_s:
            return []
        killed = []
        with contextlib.suppress(NodeUnreachable):
            for rep in self.executor.poll(self.node):
                if rep.running:
                    log.warning(
                        "no contact with the control plane for %.0f s: killing job %s gen %d",
                        self.clock() - self.last_contact_s,
                        rep.job_id,
                        rep.generation,
                    )
                    self.executor.kill(rep.job_id, rep.generation, self.node)
                    killed.append(rep)
        return killed

    # ----- report ------------------------------------------------------------------------------
    def report(self) -> WireJobs:
        """The ``jobs`` part of the next batch."""
        self.check_lease()
        now = self.clock()
        with self._lock:
            copies = []
            try:
                reps = self.executor.poll(self.node)
            except NodeUnreachable:
                reps = []
            for r in reps:
                key = (r.job_id, r.generation)
                if not r.running:
                    first = self._finished_at.setdefault(key, now)
                    if now - first > self.keep_finished_s:
                        continue
                copies.append(
                    WireJobCopy(
                        job_id=r.job_id,
                        generation=r.generation,
                        running=r.running,
                        exit_code=r.exit_code,
                        reason=r.reason[:500],
                        node_fault=r.node_fault,
                        fenced=r.fenced,
                        log_tail=self._tail(key),
                    )
                )
            for (job_id, gen), why in self.refused.items():
                if not any(c.job_id == job_id and c.generation == gen for c in copies):
                    copies.append(
                        WireJobCopy(
                            job_id=job_id,
                            generation=gen,
                            running=False,
                            exit_code=None,
                            reason=f"refused: {why}"[:500],
                        )
                    )
            slots = self.slots() if callable(self.slots) else self.slots
            return WireJobs(lease_s=self.lease_s, slots=list(slots), copies=copies)

    def _tail(self, key: tuple[str, int]) -> str | None:
        """The end of the copy's log when it changed since the last report (else None)."""
        path = self.executor.log_path(key[0], key[1], self.node)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - LOG_TAIL_BYTES))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        if self._tails.get(key) == text:
            return None
        self._tails[key] = text
        return text
