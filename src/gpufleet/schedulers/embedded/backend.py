"""``EmbeddedBackend``: the embedded scheduler behind the one scheduler protocol, as the control
plane runs it (``gpufleet controller --scheduler embedded``, ``gpufleet up``).

It keeps its jobs in the control plane's own database (the ``sched_`` tables come with the
control plane's migrations; the engine arrives with ``start``) and runs them on the nodes'
agents through a `RemoteAgentExecutor`: commands ride on the ``Ack`` of their pushes
(``exchange``). Lifecycle events: a node going lost -> ``node_lost``; a drain with ``fail``
(a fail finding, repair, failed) -> ``node_drained(fail=True)``, its jobs requeued elsewhere;
resume -> ``node_back`` (stale copies fenced first). A tick thread settles jobs and places new
ones every ``tick_s``, and at once when an agent's report shows a copy started or ended.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from gpufleet.errors import GpufleetError, UnknownNameError
from gpufleet.schedulers.base import (
    Capabilities,
    Evacuation,
    JobAttempt,
    JobSpec,
    JobState,
    JobStatus,
    SchedNodeState,
    SchedulerContext,
)
from gpufleet.schedulers.embedded import failover
from gpufleet.schedulers.embedded.engine import EmbeddedScheduler, embedded_capabilities
from gpufleet.schedulers.embedded.executor import NodeUnreachable
from gpufleet.schedulers.embedded.placement import NodeInfo
from gpufleet.schedulers.embedded.remote import RemoteAgentExecutor
from gpufleet.schedulers.embedded.sealing import SpecSealer
from gpufleet.schedulers.embedded.store import JobStore, NodeRow
from gpufleet.wire import Batch, WireCommand

log = logging.getLogger("gpufleet.schedulers.embedded")

ACTIVE = (JobState.STARTING, JobState.RUNNING)


class EmbeddedBackend:
    """The embedded scheduler inside the controller: protocol + agents' exchange + tick thread."""

    name = "embedded"
    # its command channel (the copies agents report, the commands they get back) lives in the
    # leader's memory: with several replicas, agents that run jobs push to the leader
    exchange_on_leader = True

    def __init__(self, executor: RemoteAgentExecutor | None = None, *, tick_s: float = 0.5) -> None:
        self._remote = executor
        self.tick_s = tick_s
        self.lock = threading.RLock()
        self._eng: EmbeddedScheduler | None = None
        self._context: SchedulerContext | None = None
        # Jobs the store says run, not yet seen in a report since this controller started: the
        # previous one may have died before their start reached the agent, or their copy may
        # have died while it was down (see _verify).
        self.unverified: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = True

    def capabilities(self) -> Capabilities:
        return embedded_capabilities()

    # ----- loop ------------------------------------------------------------------------------
    def start(self, context: SchedulerContext) -> None:
        self._context = context
        if self._remote is None:
            self._remote = RemoteAgentExecutor(clock=context.clock)
        self._remote.deliver = context.deliver
        # the control plane's database (same migrations); job specs sealed with a key file in
        # its data directory, so a copy of the database does not reveal a job's env
        sealer = SpecSealer.in_dir(context.secrets_dir) if context.secrets_dir else None
        store = JobStore(context.engine, sealer)
        self._eng = EmbeddedScheduler(
            store, self._remote, (), clock=context.clock, usable=self._usable
        )
        self.unverified = {j.id for j in store.jobs(ACTIVE)}
        self._leading = context.leading()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-sched", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._remote is not None:
            # the loop waits on the executor's "changed" event for up to tick_s: wake it, or a
            # stop with a long tick waited out the join's 10 s and left the thread running
            self._remote.changed.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _usable(self, node: str) -> bool:
        """May work be placed on ``node`` now? Asked of the control plane at every placement:
        a node with a fail finding whose drain the circuit breaker blocked stays "up" here
        (no drain reached the scheduler), but takes no new or requeued job."""
        assert self._context is not None
        facts = self._context.node_facts(node)
        return facts is not None and facts.usable

    @property
    def eng(self) -> EmbeddedScheduler:
        if self._eng is None:
            raise GpufleetError("the embedded scheduler is not started yet")
        return self._eng

    @property
    def store(self) -> JobStore:
        return self.eng.store

    @property
    def executor(self) -> RemoteAgentExecutor:
        if self._remote is None:
            raise GpufleetError("the embedded scheduler is not started yet")
        return self._remote

    def tick(self) -> None:
        """One scheduler pass (after checking the jobs a restart left unverified)."""
        with self.lock:
            if self.unverified:
                self._verify()
            self._refresh_nodes()
            self.eng.tick()

    def _refresh_nodes(self) -> None:
        """Bring placement's nodes in line with the control plane: each node's current tenant
        (a node re-tenanted since it joined), and a node the scheduler still holds ``lost`` or
        ``drained`` that the control plane has back in service. The lifecycle's events reach
        the scheduler on a queue that dies with the controller: killed between a node's
        ``lost`` and its ``resume``, a controller left the node lost here for good (its
        requeued jobs, excluded from it, waited forever when it was their only node)."""
        if self._context is None:
            return
        for name, row in self.store.nodes().items():
            facts = self._context.node_facts(name)
            tenant = facts.tenant if facts is not None else row.info.tenant
            if tenant != row.info.tenant:
                row = replace(row, info=replace(row.info, tenant=tenant))
                self.store.put_node(row)
            if facts is not None and facts.usable and row.state in ("lost", "drained"):
                log.info("node %s is in service again: the scheduler takes it back", name)
                self.eng.node_back(name)  # stale copies fenced, exclusions of it lifted

    def _loop(self) -> None:
        while not self._stop.is_set():
            # every tick_s, or at once when an agent's report shows a copy started or ended
            changed = self.executor.changed
            changed.wait(self.tick_s)
            changed.clear()
            if self._stop.is_set():
                return
            try:
                self._lead_tick()
            except Exception as exc:
                failed = self._context.failed if self._context is not None else None
                if failed is None:
                    log.exception("scheduler tick failed")
                else:  # the database away, a lease moved on: one line, not a traceback
                    failed("scheduler tick failed", exc)

    def _lead_tick(self) -> None:
        """A tick, on the leader only (issue 18), its transactions fenced. A replica that just
        became leader starts as a restarted controller does: every active job unverified until
        its nodes report to this replica, whose executor knows nothing from before."""
        assert self._context is not None
        leading = self._context.leading()
        if leading and not self._leading:
            with self.lock:
                old = self.executor
                remote = RemoteAgentExecutor(
                    clock=self._context.clock,
                    stale_s=old.stale_s,
                    start_timeout_s=old.start_timeout_s,
                    default_lease_s=old.lease_s - old.stale_s,
                )
                remote.deliver = self._context.deliver
                self._remote = remote
                self._eng = EmbeddedScheduler(
                    self.eng.store, remote, (), clock=self._context.clock, usable=self._usable
                )
                self.unverified = {j.id for j in self.eng.store.jobs(ACTIVE)}
            log.info("leading: the embedded scheduler places work from now on")
        self._leading = leading
        if leading:
            with self._context.fenced():
                self.tick()

    def _verify(self) -> None:
        """After a restart: an active job whose nodes all report again but lack its copy.

        The store says which: a ``starting`` job was never confirmed by an agent (its start
        died with the old controller): queue it again, no restart counted. A ``running`` job was
        confirmed by an agent's report (``RemoteAgentExecutor.confirms_starts``), so its copy
        ran and is gone (died with its node, or its agent restarted, while the controller was
        down): requeue it as a restart (``GPUFLEET_RESTART_COUNT`` + 1: resume from the
        checkpoint), or fail it when ``max_restarts`` is used up. A copy that finished while
        the controller was down is still in the report (agents keep finished copies for
        ``keep_finished_s``): it is seen here and the scheduler's tick records how it ended."""
        eng = self.eng
        now = eng.clock()
        for jid in list(self.unverified):
            job = eng.store.get(jid)
            if job is None or job.state not in ACTIVE:
                self.unverified.discard(jid)
                continue
            seen = []
            try:
                for n in job.nodes:
                    reps = eng.executor.poll(n)
                    seen.append(
                        any(r.job_id == jid and r.generation == job.generation for r in reps)
                    )
            except NodeUnreachable:
                continue  # not all of its nodes report yet (or they are lost: node_lost decides)
            self.unverified.discard(jid)
            if all(seen):
                continue
            if job.state is JobState.RUNNING:
                gone = [n for n, s in zip(job.nodes, seen, strict=True) if not s]
                why = f"copy on {gone[0]} gone while the controller was down"
                failover.requeue(eng, job, now, why)
            else:
                failover.requeue(
                    eng,
                    job,
                    now,
                    "not started: the controller restarted before its agent heard of it",
                    budget="none",
                )

    # ----- node lifecycle --------------------------------------------------------------------
    def _node_event(self, fn: Callable[[], object]) -> None:
        # UnknownNameError: a node without a jobs-capable agent: nothing scheduled there
        with self.lock, contextlib.suppress(UnknownNameError):
            fn()

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        self._node_event(lambda: self.eng.node_drained(node, reason, fail=fail))

    def resume(self, node: str) -> None:
        self._node_event(lambda: self.eng.node_back(node))

    def evacuate(self, node: str, reason: str, *, signal: str, grace_s: float) -> Evacuation:
        with self.lock:
            try:
                return self.eng.evacuate(node, reason, signal, grace_s)
            except UnknownNameError:
                return Evacuation(note="no jobs-capable agent on this node")

    def node_lost(self, node: str) -> None:
        self._node_event(lambda: self.eng.node_lost(node))

    def is_idle(self, node: str) -> bool:
        if self._eng is None:
            return True
        with self.lock:
            if any(node in j.nodes for j in self.store.jobs(ACTIVE)):
                return False
        # a copy still running there (a requeued job's copy checkpointing after its signal,
        # a kill not yet confirmed) keeps the node busy: the drain waits for it to end
        try:
            return not any(r.running for r in self.executor.poll(node))
        except NodeUnreachable:
            return True  # no fresh report: no copy known there (a lost node is not drained)

    def node_states(self) -> list[SchedNodeState]:
        with self.lock:
            return self.eng.node_states()

    # ----- the agents' exchange ----------------------------------------------------------------
    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        if self._remote is None or self._eng is None:
            return []  # not started yet: the agent's next push brings its report again
        commands, info = self._remote.observe(batch, now)
        if info is not None:
            self._join(info)
        return commands

    def _join(self, info: NodeInfo) -> None:
        """A node's agent runs jobs (or its GPUs changed): the scheduler may place work there."""
        assert self._context is not None
        facts = self._context.node_facts(info.name)
        with self.lock:
            row = self.store.nodes().get(info.name)
            if facts is not None:
                info = replace(info, rack=facts.rack, tenant=facts.tenant)
            if row is not None:
                self.store.put_node(replace(row, info=info))
                return
            usable = facts is not None and facts.usable
            why = "" if usable else (facts.why if facts else "control plane state unknown")
            self.store.put_node(NodeRow(info, "up" if usable else "drained", why, fail=False))

    # ----- jobs ----------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        with self.lock:
            return self.eng.submit(spec)

    def cancel(self, job_id: str) -> None:
        with self.lock:
            self.eng.cancel(job_id)

    def requeue(self, job_id: str) -> None:
        with self.lock:
            self.eng.requeue(job_id)

    def list_jobs(self) -> list[JobStatus]:
        with self.lock:
            return self.eng.list_jobs()

    def job(self, job_id: str) -> JobStatus:
        with self.lock:
            return self.eng.job(job_id).status()

    def attempts(self, job_id: str) -> list[JobAttempt]:
        with self.lock:
            return [
                JobAttempt(a.generation, tuple(a.nodes), a.started_at, a.ended_at, a.outcome)
                for a in self.eng.attempts(job_id)
            ]

    def logs(self, job_id: str) -> str | None:
        """The newest output tail the agent of the job's newest copy sent."""
        with self.lock:
            job = self.eng.job(job_id)
        return self.executor.log_text(job.id, job.generation)
