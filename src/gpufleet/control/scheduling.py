"""The control plane's scheduler: a ``SchedulerHook`` for the node lifecycle and the jobs API.

``gpufleet controller --scheduler embedded|slurm|none`` (``gpufleet up``: embedded) plugs one of
these in through ``gpufleet.control.up.SCHEDULER_HOOK_FACTORY``:

- ``EmbeddedControl``: the embedded scheduler on the control plane's own database (its ``sched_``
  tables come with the control plane's migrations) and a ``RemoteAgentExecutor``: jobs run on
  the nodes' agents, told through the ``Ack`` of their pushes. A node going ``lost`` ->
  ``node_lost``; a drain with a fail finding (or repair/failed) -> ``node_drained(fail=True)``:
  its jobs are requeued elsewhere; resume -> ``node_resumed`` (stale copies fenced first).
- ``SlurmControl``: drives Slurm through ``SlurmBackend``: drain -> ``scontrol update
  state=drain reason=...``, and for a lost node or a fail drain, ``scontrol requeue`` of every job
  running there (with the immediate-eligibility fix); resume -> ``state=resume``. Slurm commands
  run on a worker thread, never on the ingest path.

Both answer the jobs API (``gpufleet.control.api_jobs``): submit, list, one job, cancel, logs.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.agent.wire import Batch, WireCommand
from gpufleet.control.lifecycle import NodeState
from gpufleet.errors import GpufleetError, UnknownNameError, UsageError
from gpufleet.schedulers.base import JobSpec, JobState, JobStatus
from gpufleet.schedulers.embedded.placement import NodeInfo

if TYPE_CHECKING:
    from gpufleet.control.service import ControlService
    from gpufleet.schedulers.embedded import EmbeddedScheduler, JobExecutor
    from gpufleet.schedulers.slurm.backend import SlurmBackend

log = logging.getLogger("gpufleet.control.scheduling")

SCHEDULER_NAMES = ("embedded", "slurm", "none")
ACTIVE = (JobState.STARTING, JobState.RUNNING)


class JobsFacade(Protocol):
    """What the jobs API and the ingest path ask of the plugged-in scheduler."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def submit(self, spec: JobSpec) -> str: ...

    def list_jobs(self) -> list[JobStatus]: ...

    def job(self, job_id: str) -> JobStatus: ...

    def attempts(self, job_id: str) -> list[dict[str, Any]]: ...

    def cancel(self, job_id: str) -> None: ...

    def logs(self, job_id: str) -> str | None: ...

    def exchange(self, batch: Batch, now: float) -> list[WireCommand]: ...


def fail_drain(service: ControlService, node: str) -> bool:
    """Is this drain for a failure (a fail finding, or the node sent to repair/failed)?"""
    nc = service.store.nodes.get(node)
    if nc is None:
        return False
    if nc.state in (NodeState.REPAIR.value, NodeState.FAILED.value):
        return True
    return any(f.severity >= 2 for f in nc.findings.values())


# ----- embedded ------------------------------------------------------------------------------
class EmbeddedControl:
    """The embedded scheduler inside the controller (hook + jobs facade + its own tick thread)."""

    name = "embedded"

    def __init__(
        self,
        service: ControlService,
        executor: JobExecutor | None = None,
        *,
        tick_s: float = 0.5,
    ) -> None:
        from gpufleet.control.agent_exec import RemoteAgentExecutor
        from gpufleet.schedulers.embedded import EmbeddedScheduler, JobStore

        self.service = service
        self.executor: JobExecutor = executor or RemoteAgentExecutor(clock=service.clock)
        self.store = JobStore(service.engine)  # the control plane's database (same migrations)
        self.lock = threading.RLock()
        self.eng: EmbeddedScheduler = EmbeddedScheduler(
            self.store, self.executor, (), clock=service.clock
        )
        self.tick_s = tick_s
        # Jobs the store says run, not yet seen in a report since this controller started: the
        # previous one may have died before their start reached the agent, or their copy may
        # have died while it was down (see _verify).
        self.unverified = {j.id for j in self.store.jobs(ACTIVE)}
        # Lifecycle events wait for the scheduler thread: the hook is called on the ingest path
        # before the same batch's jobs report is read, and must not slow ingest down.
        self.events: queue.Queue[tuple[str, Callable[[], object]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpufleet-sched", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def tick(self) -> None:
        """Apply the lifecycle events that arrived, then one scheduler pass."""
        with self.lock:
            while True:
                try:
                    what, fn = self.events.get_nowait()
                except queue.Empty:
                    break
                self._call(what, fn)
            if self.unverified:
                self._verify()
            self.eng.tick()

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
        from gpufleet.schedulers.embedded import NodeUnreachable, failover

        now = self.service.clock()
        for jid in list(self.unverified):
            job = self.store.get(jid)
            if job is None or job.state not in ACTIVE:
                self.unverified.discard(jid)
                continue
            seen = []
            try:
                for n in job.nodes:
                    reps = self.executor.poll(n)
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
                failover.requeue(self.eng, job, now, why)
            else:
                failover.requeue(
                    self.eng,
                    job,
                    now,
                    "not started: the controller restarted before its agent heard of it",
                    count_restart=False,
                )

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:
                log.exception("scheduler tick failed")

    # ----- SchedulerHook -----------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], object]) -> None:
        with self.lock:
            try:
                fn()
            except UnknownNameError:
                pass  # a node without a jobs-capable agent: nothing scheduled there
            except GpufleetError as exc:
                log.warning("scheduler %s: %s", what, exc)

    def drain(self, node: str, reason: str) -> None:
        fail = fail_drain(self.service, node)
        self.events.put(("drain", lambda: self.eng.node_drained(node, reason, fail=fail)))

    def resume(self, node: str) -> None:
        self.events.put(("resume", lambda: self.eng.node_back(node)))

    def lost(self, node: str) -> None:
        self.events.put(("lost", lambda: self.eng.node_lost(node)))

    def is_idle(self, node: str) -> bool:
        with self.lock:
            return not any(node in j.nodes for j in self.store.jobs(ACTIVE))

    # ----- the agents' exchange ----------------------------------------------------------------
    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        from gpufleet.control.agent_exec import RemoteAgentExecutor

        ex = self.executor
        if not isinstance(ex, RemoteAgentExecutor):
            return []
        commands, info = ex.observe(batch, now)
        if info is not None:
            self._join(info)
        return commands

    def _join(self, info: NodeInfo) -> None:
        """A node's agent runs jobs (or its GPUs changed): the scheduler may place work there."""
        from gpufleet.schedulers.embedded.store import NodeRow

        nc = self.service.store.nodes.get(info.name)
        with self.lock:
            row = self.store.nodes().get(info.name)
            if nc is not None:
                info = replace(info, rack=nc.rack)
            if row is not None:
                self.store.put_node(replace(row, info=info))
                return
            usable = nc is not None and nc.state == NodeState.IN_SERVICE.value and not nc.cordoned
            state = "up" if usable else "drained"
            why = "" if usable else f"control plane state {nc.state if nc else 'unknown'}"
            self.store.put_node(NodeRow(info, state, why, fail=False))

    # ----- jobs facade -------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        with self.lock:
            job_id = self.eng.submit(spec)
        return job_id

    def list_jobs(self) -> list[JobStatus]:
        with self.lock:
            return self.eng.list_jobs()

    def job(self, job_id: str) -> JobStatus:
        with self.lock:
            return self.eng.job(job_id).status()

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "generation": a.generation,
                    "nodes": list(a.nodes),
                    "started_at_s": a.started_at,
                    "ended_at_s": a.ended_at,
                    "outcome": a.outcome,
                }
                for a in self.eng.attempts(job_id)
            ]

    def cancel(self, job_id: str) -> None:
        with self.lock:
            self.eng.cancel(job_id)

    def logs(self, job_id: str) -> str | None:
        from gpufleet.control.agent_exec import RemoteAgentExecutor

        with self.lock:
            job = self.eng.job(job_id)
            path = self.eng.log_path(job_id)
        if path is not None:
            return path.read_text(encoding="utf-8", errors="replace")
        if isinstance(self.executor, RemoteAgentExecutor):
            return self.executor.log_text(job.id, job.generation)
        return None


# ----- Slurm ---------------------------------------------------------------------------------
class SlurmControl:
    """Slurm as the controller's scheduler: lifecycle -> scontrol, jobs -> sbatch/squeue."""

    name = "slurm"

    def __init__(self, service: ControlService, backend: SlurmBackend | None = None) -> None:
        from gpufleet.schedulers.slurm.backend import SlurmBackend

        self.service = service
        self.backend = backend or SlurmBackend()
        self.actions: queue.Queue[tuple[str, str, str] | None] = queue.Queue()
        self.done: list[tuple[str, str, str]] = []  # (action, node, outcome), for tests/figures
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="gpufleet-slurm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.actions.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            item = self.actions.get()
            if item is None:
                return
            action, node, reason = item
            try:
                outcome = self._do(action, node, reason)
            except GpufleetError as exc:
                outcome = f"error: {exc}"
                log.warning("slurm %s %s: %s", action, node, exc)
            self.done.append((action, node, outcome))

    def _do(self, action: str, node: str, reason: str) -> str:
        b = self.backend
        if action == "resume":
            st = next((n for n in b.node_states() if n.name == node), None)
            if st is None or "drain" not in st.state:
                return "not drained: nothing to resume"  # e.g. a node entering service
            b.resume(node)
            return "resumed"
        b.drain(node, reason or f"gpufleet: {action}")
        if action == "drain":
            return "drained"
        moved = []
        for job in b.list_jobs():
            if job.state in (JobState.RUNNING, JobState.STARTING) and node in job.nodes:
                b.requeue(job.id)
                moved.append(job.id)
        return f"drained; requeued {','.join(moved) or 'nothing'}"

    # ----- SchedulerHook -----------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        fail = fail_drain(self.service, node)
        self.actions.put(("fail" if fail else "drain", node, f"gpufleet: {reason}"[:200]))

    def resume(self, node: str) -> None:
        self.actions.put(("resume", node, ""))

    def lost(self, node: str) -> None:
        self.actions.put(("fail", node, "gpufleet: node lost (no heartbeat)"))

    def is_idle(self, node: str) -> bool:
        try:
            jobs = self.backend.list_jobs()
        except GpufleetError:
            return False
        return not any(j.state is JobState.RUNNING and node in j.nodes for j in jobs)

    # ----- jobs facade -------------------------------------------------------------------------
    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        return []  # Slurm runs the jobs; agents only report health

    def submit(self, spec: JobSpec) -> str:
        return self.backend.submit(spec)

    def list_jobs(self) -> list[JobStatus]:
        return self.backend.list_jobs()

    def job(self, job_id: str) -> JobStatus:
        try:
            return self.backend.job(job_id)
        except UnknownNameError as exc:
            raise UsageError(f"no job {job_id!r}") from exc

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return []

    def cancel(self, job_id: str) -> None:
        self.backend.cancel(job_id)

    def logs(self, job_id: str) -> str | None:
        from pathlib import Path

        out = self.backend.output_dir
        if not out:
            return None
        for name in (f"slurm-{job_id}.out", f"{job_id}.out"):
            p = Path(out) / name
            if p.exists():
                return p.read_text(encoding="utf-8", errors="replace")
        return None


# ----- wiring ----------------------------------------------------------------------------------
def install(service: ControlService, scheduler: str, **options: Any) -> JobsFacade | None:
    """Plug the named scheduler into ``service`` (hook + jobs facade) and start it."""
    if scheduler not in SCHEDULER_NAMES:
        raise UsageError(f"--scheduler {scheduler!r}: expected one of {', '.join(SCHEDULER_NAMES)}")
    if scheduler == "none":
        return None
    facade: EmbeddedControl | SlurmControl
    if scheduler == "embedded":
        facade = EmbeddedControl(service, **options)
    else:
        facade = SlurmControl(service, **options)
    service.set_hook(facade)
    service.jobs = facade
    facade.start()
    return facade


def hook_factory(scheduler: str, **options: Any) -> Callable[[ControlService], Any]:
    """A ``SCHEDULER_HOOK_FACTORY`` entry: builds, plugs in and starts the named scheduler."""
    if scheduler not in SCHEDULER_NAMES:
        raise UsageError(f"--scheduler {scheduler!r}: expected one of {', '.join(SCHEDULER_NAMES)}")

    def make(service: ControlService) -> Any:
        from gpufleet.control.lifecycle import NullSchedulerHook

        facade = install(service, scheduler, **options)
        return facade if facade is not None else NullSchedulerHook()

    return make
