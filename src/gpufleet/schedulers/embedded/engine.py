"""``EmbeddedScheduler``: the built-in scheduler for one server or a small lab.

It needs nothing else: a ``JobStore`` (SQLite by default) holds every job, a ``JobExecutor``
(the node agents, or a simulation) runs them. Nothing happens on its own: ``tick(now)`` (driven
by the caller's clock) polls the agents, records how copies ended, fences strays and starts what
fits. Inside the control plane `EmbeddedBackend` (``backend``) drives it behind the one
scheduler protocol and reports node lifecycle events through ``node_lost``, ``node_drained``,
``node_resumed`` and ``node_back``; ``gpufleet jobs`` drives it directly on one machine.

One engine should drive a store at a time (the control plane's leader, or a CLI call under the
state directory's lock); every write is still a compare-and-set on the job's generation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gpufleet.errors import UsageError
from gpufleet.schedulers.base import (
    Capabilities,
    Capability,
    Evacuation,
    Feature,
    JobSpec,
    JobState,
    JobStatus,
    SchedNodeState,
)
from gpufleet.schedulers.embedded import failover
from gpufleet.schedulers.embedded.executor import (
    CopyReport,
    ExecutorError,
    JobExecutor,
    Launch,
    NodeUnreachable,
    visible_devices,
)
from gpufleet.schedulers.embedded.placement import NodeInfo, Placement, check_feasible, place
from gpufleet.schedulers.embedded.queue import QueueEntry, Quotas, ordered
from gpufleet.schedulers.embedded.store import Attempt, JobRow, JobStore, NodeRow

ACTIVE = failover.ACTIVE
WAITING = failover.WAITING

Listener = Callable[[str, JobState, JobState, float], None]


def embedded_capabilities() -> Capabilities:
    """What the embedded scheduler does, and what it cannot, with the reason."""
    return Capabilities(
        "embedded",
        [
            Capability(Feature.SUBMIT, True),
            Capability(Feature.LIST_JOBS, True),
            Capability(Feature.REQUEUE, True, "jobs of lost or fail-drained nodes move elsewhere"),
            Capability(Feature.JOB_ATTEMPTS, True),
            Capability(Feature.JOB_LOGS, True, "the output tail each agent sends"),
            Capability(Feature.AGENT_JOBS, True, "jobs run by the gpufleet agents"),
            Capability(Feature.DRAIN, True),
            Capability(
                Feature.EVACUATE,
                True,
                "the agent signals the job's process, kills it after the grace, and the job"
                " is requeued (max_requeues, not max_restarts)",
            ),
            Capability(Feature.REPORTS_IDLE, True),
            Capability(Feature.NODE_STATES, True),
            Capability(Feature.MULTI_NODE, True, "gpus is per node; no rendezvous beyond env vars"),
            Capability(Feature.PRIORITY, True, "orders the queue; running jobs are not preempted"),
            Capability(Feature.MAX_RESTARTS, True),
            Capability(Feature.MIN_GPU_MEMORY, True),
            Capability(
                Feature.CONTAINER_IMAGES,
                False,
                "the agents run argument lists only; use the kubernetes backend",
            ),
            Capability(Feature.MIG, False, "placement counts whole GPUs; MIG slices not tracked"),
        ],
    )


@dataclass(frozen=True)
class TickResult:
    """What one tick did."""

    started: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()


class EmbeddedScheduler:
    """Queue, placement, execution and failover over a durable store."""

    name = "embedded"

    def __init__(
        self,
        store: JobStore,
        executor: JobExecutor,
        nodes: Iterable[NodeInfo] = (),
        clock: Callable[[], float] = time.time,
        quotas: Mapping[str, int] | None = None,
        listener: Listener | None = None,
        usable: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        # asked at every placement: may work go to this node now? (the control plane's view:
        # in service, not cordoned, no fail finding, no lost GPU; see ``EmbeddedBackend``)
        self.usable: Callable[[str], bool] = usable or (lambda node: True)
        self.executor = executor
        self.clock = clock
        self.listener = listener
        self.started_at = clock()
        self.last_contact: dict[str, float] = {}
        known = store.nodes()
        for info in nodes:  # new nodes join "up"; known ones keep their state, get new inventory
            row = known.get(info.name)
            store.put_node(NodeRow(info) if row is None else replace(row, info=info))
        for tenant, gpus in (quotas or {}).items():
            store.set_quota(tenant, gpus)
        failover.reconcile(self, self.started_at)

    # ----- jobs --------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        embedded_capabilities().check_spec(spec)  # image, mig_profile: refused with the reason
        nodes = [r.info for r in self.store.nodes().values()]
        if not nodes:
            raise UsageError("the embedded scheduler knows no nodes", hint="add nodes first")
        check_feasible(spec, nodes)
        quotas = Quotas(self.store.quotas())
        if quotas.exceeds_alone(spec.tenant, spec.gpus * spec.nodes):
            raise UsageError(
                f"job {spec.name!r}: asks {spec.gpus * spec.nodes} GPUs, more than tenant "
                f"{spec.tenant!r}'s quota of {quotas.limits[spec.tenant]}"
            )
        now = self.clock()
        job = self.store.add_job(JobRow(seq=0, spec=spec, state=JobState.QUEUED, submitted_at=now))
        if self.listener:
            self.listener(job.id, JobState.QUEUED, JobState.QUEUED, now)
        return job.id

    def job(self, job_id: str) -> JobRow:
        job = self.store.get(job_id)
        if job is None:
            raise UsageError(f"no job {job_id!r}")
        return job

    def cancel(self, job_id: str) -> None:
        job = self.job(job_id)
        if job.state.final:
            return
        now = self.clock()
        if job.state in ACTIVE:
            failover.kill_copies(self, job)  # unconfirmed kills are fenced when the node is back
        self.transition(
            job, replace(job, state=JobState.CANCELLED, ended_at=now, reason="cancelled"), now
        )

    def list_jobs(self) -> list[JobStatus]:
        return [j.status() for j in self.store.jobs()]

    def node_states(self) -> list[SchedNodeState]:
        used: dict[str, int] = {}
        for job in self.store.jobs(ACTIVE):
            for node, gpus in zip(job.nodes, job.gpus, strict=False):
                used[node] = used.get(node, 0) + len(gpus)
        out = []
        for name, row in self.store.nodes().items():
            total, alloc = len(row.info.gpus), used.get(name, 0)
            if row.state == "lost":
                word = "down"
            elif row.state == "drained":
                word = "drain"
            else:
                word = "idle" if alloc == 0 else "alloc" if alloc >= total else "mixed"
            usable = row.state == "up" and self.usable(name)
            out.append(SchedNodeState(name, word, row.reason, total, alloc, usable))
        return out

    def drain(self, node: str, reason: str) -> None:
        self.node_drained(node, reason, fail=False)

    def resume(self, node: str) -> None:
        self.node_resumed(node)

    def requeue(self, job_id: str) -> None:
        job = self.job(job_id)
        if job.state.final:
            raise UsageError(f"job {job_id} already ended ({job.state.value})")
        if job.state in ACTIVE:
            failover.requeue(self, job, self.clock(), "requeued by request", budget="none")

    def set_quota(self, tenant: str, gpus: int | None) -> None:
        self.store.set_quota(tenant, gpus)

    # ----- node events (from the control plane's lifecycle) ------------------------------
    def _node(self, node: str) -> NodeRow:
        rows = self.store.nodes()
        if node not in rows:
            from gpufleet.errors import UnknownNameError

            raise UnknownNameError("node", node, sorted(rows))
        return rows[node]

    def node_lost(self, node: str, reason: str = "node lost") -> list[str]:
        """The node stopped answering: requeue its jobs (after its agent's lease if unconfirmed)."""
        row = self._node(node)
        self.store.put_node(replace(row, state="lost", reason=reason))
        return failover.on_node_failure(self, node, self.clock(), f"node {node}: {reason}")

    def node_drained(self, node: str, reason: str, fail: bool = False) -> list[str]:
        """No new jobs on ``node``; with ``fail`` (a fail finding) its jobs move elsewhere now."""
        row = self._node(node)
        self.store.put_node(replace(row, state="drained", reason=reason, fail=fail))
        if not fail:
            return []
        return failover.on_node_failure(self, node, self.clock(), f"node {node}: {reason}")

    def evacuate(self, node: str, reason: str, sig: str, grace_s: float) -> Evacuation:
        """Every active job with a copy on ``node``: each copy gets ``sig`` and ``grace_s``
        seconds to exit (a checkpoint stop), and the job is requeued at once as an
        infrastructure requeue; it starts again elsewhere once its old copies are confirmed
        gone (or their lease ran out). A copy whose node cannot be reached is only killed."""
        self._node(node)
        now = self.clock()
        signalled = killed = 0
        moved: list[str] = []
        for job in self.store.jobs(ACTIVE):
            if node not in job.nodes:
                continue
            reached = True
            for n in job.nodes:
                try:
                    self.executor.signal_stop(job.id, job.generation, n, sig, grace_s)
                except NodeUnreachable:
                    reached = False
                    failover.kill_copies(self, job)
            signalled += reached
            killed += not reached
            if failover.requeue(self, job, now, reason, confirmed=False) is not None:
                moved.append(job.id)
        return Evacuation(signalled, killed, tuple(moved))

    def node_resumed(self, node: str) -> None:
        """A drained node takes jobs again."""
        self._back(node)

    def node_back(self, node: str) -> None:
        """A lost node answers again: kill its stale copies, then let it take jobs."""
        self._back(node)

    def _back(self, node: str) -> None:
        row = self._node(node)
        self.fence_node(node)
        self.store.put_node(replace(row, state="up", reason="", fail=False))
        now = self.clock()
        for job in self.store.jobs(WAITING):
            if node in job.excluded:
                excluded = tuple(n for n in job.excluded if n != node)
                self.transition(job, replace(job, excluded=excluded), now)

    def fence_node(self, node: str) -> list[CopyReport]:
        valid = {j.id: j.generation for j in self.store.jobs(ACTIVE) if node in j.nodes}
        try:
            killed = self.executor.fence(node, valid)
        except NodeUnreachable:
            return []
        self.last_contact[node] = self.clock()
        return killed

    # ----- state changes -------------------------------------------------------------------
    def transition(self, old: JobRow, new: JobRow, now: float, outcome: str = "") -> JobRow | None:
        """Write ``new`` if nobody changed the job since ``old`` was read; its attempts (the
        old one closed, a new one opened) in the same transaction."""
        moved_on = new.state not in ACTIVE or new.generation != old.generation
        closing = old.state in ACTIVE and moved_on
        opening = new.state is JobState.STARTING and old.generation != new.generation
        if not self.store.save(
            new,
            expect_generation=old.generation,
            close=(old, now, outcome or new.state.value) if closing else None,
            open_at=now if opening else None,
        ):
            return None
        if self.listener and old.state != new.state:
            self.listener(new.id, old.state, new.state, now)
        return new

    def settle(self, job: JobRow, mine: Mapping[str, CopyReport], now: float) -> JobRow | None:
        """Compare an active job with what its agents report; return it as it is now."""
        missing = [n for n in job.nodes if n not in mine]
        if missing:
            return failover.requeue(self, job, now, f"copy on {missing[0]} vanished")
        reps = [mine[n] for n in job.nodes]
        faults = [r for r in reps if not r.running and (r.node_fault or r.exit_code is None)]
        if faults:
            r = faults[0]
            why = r.reason or "copy stopped"
            if r.fenced and not r.node_fault:  # the lease ran out or the agent died: not the job
                return failover.requeue(self, job, now, f"node {r.node}: {why}", budget="requeue")
            return failover.requeue(self, job, now, f"node {r.node}: {why}", faulty_node=r.node)
        exited = [r for r in reps if not r.running]
        if not exited:
            if job.state is JobState.STARTING and all(r.confirmed for r in reps):
                running = replace(job, state=JobState.RUNNING, started_at=now)
                return self.transition(job, running, now)
            return job
        bad = [r for r in exited if r.exit_code != 0]
        if bad:
            code = bad[0].exit_code
            # copies that exited need no kill (asking would wait out the kill grace); the other
            # ranks of a multi-node job are killed
            ended = len(exited) == len(reps) or failover.kill_copies(self, job)
            if job.restarts < job.spec.max_restarts:  # its own failure: the restart budget
                return failover.requeue(
                    self, job, now, f"exit {code}", budget="restart", confirmed=ended
                )
            why = f"exit {code}"
            if job.spec.max_restarts:
                why += f"; no restarts left (max_restarts={job.spec.max_restarts})"
            new = replace(job, state=JobState.FAILED, exit_code=code, ended_at=now, reason=why)
            return self.transition(job, new, now, f"exit {code}")
        if len(exited) == len(reps):
            new = replace(job, state=JobState.SUCCEEDED, exit_code=0, ended_at=now, reason="")
            return self.transition(job, new, now, "exit 0")
        return job

    # ----- the loop ------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickResult:
        """Poll agents, settle jobs, fence strays, start what fits."""
        now = self.clock() if now is None else now
        nodes = self.store.nodes()
        reports: dict[str, list[CopyReport]] = {}
        for name, row in nodes.items():
            if row.state == "lost":
                continue
            try:
                reports[name] = self.executor.poll(name)
                self.last_contact[name] = now
            except NodeUnreachable:
                continue
        finished = []
        for job in self.store.jobs(ACTIVE):
            if any(n not in reports for n in job.nodes):
                continue
            mine = {
                r.node: r
                for n in job.nodes
                for r in reports[n]
                if r.job_id == job.id and r.generation == job.generation
            }
            after = self.settle(job, mine, now)
            if after is not None and after.state.final:
                finished.append(job.id)
        active = self.store.jobs(ACTIVE)
        for name, reps in reports.items():
            valid = {j.id: j.generation for j in active if name in j.nodes}
            if any(r.running and valid.get(r.job_id) != r.generation for r in reps):
                self.fence_node(name)
        failover.release_confirmed(self, now)
        up = [nodes[n].info for n in sorted(reports) if nodes[n].state == "up" and self.usable(n)]
        started = self._schedule(now, up, active)
        return TickResult(tuple(started), tuple(finished))

    def _schedule(self, now: float, up: list[NodeInfo], active: list[JobRow]) -> list[str]:
        used: dict[str, set[int]] = {}
        tenant_use: dict[str, int] = {}
        for job in active:
            for node, gpus in zip(job.nodes, job.gpus, strict=False):
                used.setdefault(node, set()).update(gpus)
            tenant_use[job.spec.tenant] = tenant_use.get(job.spec.tenant, 0) + sum(
                len(g) for g in job.gpus
            )
        quotas = Quotas(self.store.quotas())
        waiting = {j.id: j for j in self.store.jobs(WAITING)}
        entries = [
            QueueEntry(
                j.id,
                j.spec.tenant,
                j.spec.priority,
                j.seq,
                j.spec.gpus * j.spec.nodes,
                j.not_before,
            )
            for j in waiting.values()
        ]
        started = []
        for e in ordered(entries):
            job = waiting[e.job_id]
            if e.not_before_s > now:
                self._note(job, f"waiting until the old copy is fenced (t={e.not_before_s:.1f})")
                continue
            if not quotas.allows(e.tenant, tenant_use.get(e.tenant, 0), e.gpus_total):
                self._note(job, f"waiting: tenant {e.tenant!r} at its GPU quota")
                continue
            p = place(job.spec, up, used, exclude=job.excluded)
            if p is None:
                self._note(job, "waiting for free GPUs")
                continue
            if self._launch(job, p, now):
                started.append(job.id)
                for node, gpus in zip(p.nodes, p.gpus, strict=True):
                    used.setdefault(node, set()).update(gpus)
                tenant_use[e.tenant] = tenant_use.get(e.tenant, 0) + e.gpus_total
        return started

    def _note(self, job: JobRow, reason: str) -> None:
        if job.reason != reason:
            self.transition(job, replace(job, reason=reason), self.clock())

    def launch_env(
        self, job: JobRow, rank: int, node: str, gpus: tuple[int, ...]
    ) -> dict[str, str]:
        env = dict(job.spec.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible_devices(gpus),
                "GPUFLEET_JOB_ID": job.id,
                "GPUFLEET_JOB_NAME": job.spec.name,
                "GPUFLEET_TENANT": job.spec.tenant,
                "GPUFLEET_RESTART_COUNT": str(job.restarts + job.requeues),
                "GPUFLEET_GENERATION": str(job.generation),
                "GPUFLEET_NODES": ",".join(job.nodes),
                "GPUFLEET_NODE_RANK": str(rank),
                "GPUFLEET_NODE": node,
            }
        )
        if job.spec.checkpoint_dir:
            env["GPUFLEET_CHECKPOINT_DIR"] = job.spec.checkpoint_dir
        return env

    def _launch(self, job: JobRow, p: Placement, now: float) -> bool:
        starting = replace(
            job,
            state=JobState.STARTING,
            generation=job.generation + 1,
            nodes=p.nodes,
            gpus=p.gpus,
            reason="",
        )
        if self.transition(job, starting, now) is None:
            return False  # someone else moved it
        started: list[str] = []
        for rank, (node, gpus) in enumerate(zip(p.nodes, p.gpus, strict=True)):
            launch = Launch(
                job.id,
                starting.generation,
                node,
                gpus,
                self.launch_env(starting, rank, node, gpus),
                job.spec,
            )
            try:
                self.executor.start(launch)
                started.append(node)
            except (ExecutorError, NodeUnreachable) as exc:
                for n in started:
                    with contextlib.suppress(NodeUnreachable):
                        self.executor.kill(job.id, starting.generation, n)
                if isinstance(exc, NodeUnreachable):
                    back = replace(starting, state=job.state, reason=f"could not start: {exc}")
                    self.transition(starting, back, now, f"not started: {exc}")
                else:
                    failed = replace(starting, state=JobState.FAILED, ended_at=now, reason=str(exc))
                    self.transition(starting, failed, now, f"failed to start: {exc}")
                return False
            self.last_contact[node] = now
        if self.executor.confirms_starts:
            return True  # ``running`` once an agent's report shows the copy (see ``settle``)
        running = replace(starting, state=JobState.RUNNING, started_at=now)
        return self.transition(starting, running, now) is not None

    # ----- reading -------------------------------------------------------------------------
    def attempts(self, job_id: str) -> list[Attempt]:
        return self.store.attempts(self.job(job_id).id)

    def log_path(self, job_id: str) -> Path | None:
        """The log of the job's latest copy (node rank 0), if its executor keeps one."""
        job = self.job(job_id)
        if not job.nodes:
            return None
        return self.executor.log_path(job.id, job.generation, job.nodes[0])
