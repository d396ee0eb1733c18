"""`SlurmBackend`: gpufleet's scheduler protocol on a real Slurm cluster.

Node lifecycle -> ``scontrol update NodeName=X State=DRAIN Reason=gpufleet: ...`` /
``State=RESUME``; a lost node or a drain for a failure also requeues (``scontrol requeue``) every
job running there; jobs -> ``sbatch --gres=gpu:N --requeue``, ``scancel``; state from
``sinfo --json`` and ``squeue --json`` (Slurm 22.05 has no ``scontrol --json``). Every program
runs through one runner (`SlurmCommands.run`); the control plane calls the lifecycle methods on
its scheduler thread, never on the ingest path.

A requeued batch job gets a begin time of now + ``cred_expire`` + 1 s when its old allocation has
finished completing (slurm.conf(5), AuthInfo ``cred_expire``: "This also controls how long a
requeued job must wait before starting again. The default value is 120 seconds"), so it shows
``Reason=BeginTime`` for about two minutes. :meth:`SlurmBackend.requeue` waits until the job is
PENDING again and then sets ``StartTime=now``, which makes it eligible at once.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import GpufleetError, UnknownNameError
from gpufleet.schedulers.base import (
    Capabilities,
    Capability,
    Evacuation,
    Feature,
    JobAttempt,
    JobSpec,
    JobState,
    JobStatus,
    SchedNodeState,
    SchedulerContext,
)
from gpufleet.schedulers.slurm.commands import SlurmBinaries, SlurmCommands, reason_text
from gpufleet.schedulers.slurm.errors import SlurmError, SlurmUnknownNodeError

# squeue job_state -> gpufleet state (squeue(1), "JOB STATE CODES").
_STATES: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "CONFIGURING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.REQUEUED,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.FAILED,
}
_UNSCHEDULABLE = {
    "down",
    "drain",
    "drained",
    "draining",
    "fail",
    "failing",
    "future",
    "maint",
    "reboot_requested",
    "reboot_issued",
    "power_down",
    "powered_down",
    "not_responding",
    "unknown",
    "inval",
}


if TYPE_CHECKING:
    from gpufleet.wire import Batch, WireCommand

log = logging.getLogger("gpufleet.schedulers.slurm")


class SlurmBackend:
    """gpufleet jobs and node lifecycle on Slurm, through Slurm's own client programs."""

    name = "slurm"

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        binaries: SlurmBinaries | None = None,
        commands: SlurmCommands | None = None,
        partition: str | None = None,
        gres_type: str | None = None,
        output_dir: str | None = None,
        requeue_settle_s: float = 15.0,
        reason_prefix: str = "gpufleet: ",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cmd = commands or SlurmCommands(
            binaries=binaries or SlurmBinaries(), slurm_conf=slurm_conf
        )
        self.partition = partition
        self.gres_type = gres_type
        self.output_dir = output_dir  # job stdout/stderr; Slurm's default is the submit cwd
        self.requeue_settle_s = requeue_settle_s
        self.reason_prefix = reason_prefix
        self._clock = clock
        self._sleep = sleep

    def capabilities(self) -> Capabilities:
        """What this backend does, and what Slurm (or this backend) cannot, with the reason."""
        return Capabilities(
            self.name,
            [
                Capability(Feature.SUBMIT, True, "sbatch --requeue; scancel"),
                Capability(
                    Feature.LIST_JOBS,
                    True,
                    "squeue --json: pending and running jobs, and finished"
                    " ones until MinJobAge (300 s by default) purges them",
                ),
                Capability(Feature.REQUEUE, True, "batch jobs only; sbatch --requeue is set"),
                Capability(Feature.JOB_ATTEMPTS, False, "Slurm keeps a restart count only"),
                Capability(
                    Feature.JOB_LOGS,
                    self.output_dir is not None,
                    "read from the output directory"
                    if self.output_dir
                    else "job output stays where Slurm writes it (no output directory set)",
                ),
                Capability(Feature.AGENT_JOBS, False, "Slurm runs the jobs; agents report"),
                Capability(Feature.DRAIN, True, "scontrol update State=DRAIN/RESUME"),
                Capability(
                    Feature.EVACUATE,
                    True,
                    "scancel --batch --signal=SIG, then scontrol requeue after the grace",
                ),
                Capability(Feature.REPORTS_IDLE, True, "squeue: no running job on the node"),
                Capability(Feature.NODE_STATES, True, "sinfo --json"),
                Capability(Feature.MULTI_NODE, True, "sbatch --nodes"),
                Capability(
                    Feature.CONTAINER_IMAGES,
                    False,
                    "needs a container plugin (e.g. pyxis) this backend does not assume",
                ),
                Capability(Feature.MIG, False, "needs MIG GRES types in gres.conf; not generated"),
                Capability(
                    Feature.MIN_GPU_MEMORY,
                    False,
                    "Slurm has no GPU-memory constraint; ask for a GPU model (gres type)",
                ),
                Capability(
                    Feature.PRIORITY,
                    False,
                    "raising priority needs a Slurm operator; gpufleet"
                    " leaves ordering to Slurm's priority plugin",
                ),
                Capability(
                    Feature.MAX_RESTARTS,
                    False,
                    "Slurm has no per-job restart limit; it counts restarts (restart_cnt)",
                ),
            ],
        )

    def start(self, context: SchedulerContext) -> None:
        return None  # no background work: every call runs Slurm's programs

    def stop(self) -> None:
        return None

    # --- jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        self.capabilities().check_spec(spec)
        gtype = self.gres_type
        if spec.gpu_model:
            from gpufleet.schedulers.slurm.config_gen import gres_type

            gtype = gres_type(spec.gpu_model)
        env = dict(spec.env)
        if spec.checkpoint_dir:
            env.setdefault("GPUFLEET_CHECKPOINT_DIR", spec.checkpoint_dir)
        args = self.cmd.sbatch_args(spec, gtype, self.partition, self.output_dir)
        res = self.cmd.run(args, job_env=env)
        job_id = res.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {res.stdout.strip()!r}")
        return job_id

    def cancel(self, job_id: str) -> None:
        self.cmd.run(self.cmd.cancel_args(job_id))

    def list_jobs(self) -> list[JobStatus]:
        doc = self._json(self.cmd.squeue_args())
        return [_job(j) for j in doc.get("jobs", [])]

    def job(self, job_id: str) -> JobStatus:
        """One job by id (raises an unknown-name error when Slurm does not list it)."""
        jobs = self.list_jobs()
        for j in jobs:
            if j.id == job_id:
                return j
        raise UnknownNameError("Slurm job", job_id, [j.id for j in jobs])

    def attempts(self, job_id: str) -> list[JobAttempt]:
        return []  # Slurm keeps a restart count, not where each copy ran

    def logs(self, job_id: str) -> str | None:
        """The job's output file in ``output_dir`` (None when there is none)."""
        if not self.output_dir:
            return None
        for name in (f"slurm-{job_id}.out", f"{job_id}.out"):
            p = Path(self.output_dir) / name
            if p.exists():
                return p.read_text(encoding="utf-8", errors="replace")
        return None

    def exchange(self, batch: Batch, now: float) -> list[WireCommand]:
        return []  # Slurm runs the jobs; agents only report health

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue``, then make the job eligible at once.

        The requeue finishes when the old allocation is done completing; only then does Slurm
        set the delayed begin time, so a ``StartTime=now`` sent earlier is overwritten. Wait
        (bounded by ``requeue_settle_s``) for PENDING, then send it.
        """
        self.cmd.run(self.cmd.requeue_args(job_id))
        deadline = self._clock() + self.requeue_settle_s
        while True:
            raw = self._raw_job(job_id)
            if raw is not None and raw.get("job_state") == "PENDING":
                self.cmd.run(self.cmd.start_now_args(job_id))
                return
            if self._clock() >= deadline:
                raise SlurmError(
                    f"job {job_id} was requeued but did not return to PENDING within "
                    f"{self.requeue_settle_s:g} s (still {raw and raw.get('job_state')})",
                    hint="it will start after AuthInfo cred_expire (120 s by default)",
                )
            self._sleep(0.05)

    def _raw_job(self, job_id: str) -> dict[str, Any] | None:
        doc = self._json([*self.cmd.squeue_args(), f"--jobs={job_id}"])
        return next((j for j in doc.get("jobs", []) if str(j.get("job_id")) == job_id), None)

    # --- nodes ------------------------------------------------------------------------------
    def node_states(self) -> list[SchedNodeState]:
        doc = self._json(self.cmd.sinfo_args())
        seen: dict[str, SchedNodeState] = {}
        for n in doc.get("nodes", []):
            node = _node(n)
            seen.setdefault(node.name, node)  # sinfo lists a node once per partition
        return list(seen.values())

    def drain(self, node: str, reason: str, *, fail: bool = False) -> None:
        """``State=DRAIN`` with ``reason_prefix + reason``; with ``fail`` also requeue every job
        running on ``node`` (with the immediate-eligibility fix)."""
        if not reason.strip():
            raise GpufleetError(f"drain {node}: Slurm needs a reason")
        self._node_cmd(self.cmd.drain_args(node, reason_text(self.reason_prefix + reason)), node)
        if fail:
            for job in self.list_jobs():
                if job.state in (JobState.RUNNING, JobState.STARTING) and node in job.nodes:
                    self.requeue(job.id)

    def resume(self, node: str) -> None:
        """``State=RESUME`` when Slurm has the node drained (a node entering service that Slurm
        never drained is left alone)."""
        st = next((n for n in self.node_states() if n.name == node), None)
        if st is None:
            raise SlurmUnknownNodeError("Slurm node", node, [n.name for n in self.node_states()])
        if "drain" in st.state:
            self._node_cmd(self.cmd.resume_args(node), node)

    def evacuate(self, node: str, reason: str, *, signal: str, grace_s: float) -> Evacuation:
        """A drain's deadline: each job running on ``node`` gets ``signal`` in its batch shell
        now (``scancel --batch --signal``), and ``grace_s`` later is requeued (``scontrol
        requeue``: Slurm's own requeue, counted in ``restart_cnt``; a job that exited after
        its checkpoint is requeued too, it did not finish its work). The requeue runs on a
        timer thread so the caller's thread is not held for the grace."""
        signalled: list[str] = []
        killed: list[str] = []
        for job in self.list_jobs():
            if job.state not in (JobState.RUNNING, JobState.STARTING) or node not in job.nodes:
                continue
            try:
                self.cmd.run(self.cmd.signal_args(job.id, signal))
                signalled.append(job.id)
            except GpufleetError as exc:
                log.warning("job %s: checkpoint signal %s failed: %s", job.id, signal, exc)
                killed.append(job.id)
        jobs = [*signalled, *killed]
        if jobs:
            timer = threading.Timer(grace_s, self._requeue_all, args=(jobs,))
            timer.daemon = True
            timer.start()
        return Evacuation(len(signalled), len(killed), tuple(jobs))

    def _requeue_all(self, jobs: list[str]) -> None:
        for job_id in jobs:
            try:
                self.requeue(job_id)
            except GpufleetError as exc:
                log.warning("job %s: requeue after the checkpoint grace failed: %s", job_id, exc)

    def node_lost(self, node: str) -> None:
        self.drain(node, "node lost (no heartbeat)", fail=True)

    def is_idle(self, node: str) -> bool:
        try:
            jobs = self.list_jobs()
        except GpufleetError:
            return False
        busy = (JobState.RUNNING, JobState.STARTING)  # CONFIGURING (prolog, boot) counts
        return not any(j.state in busy and node in j.nodes for j in jobs)

    def _node_cmd(self, argv: list[str], node: str) -> None:
        try:
            self.cmd.run(argv)
        except SlurmUnknownNodeError as exc:
            try:
                known = [n.name for n in self.node_states()]
            except GpufleetError:
                known = []
            raise SlurmUnknownNodeError("Slurm node", node, known) from exc

    def _json(self, argv: list[str]) -> dict[str, Any]:
        res = self.cmd.run(argv)
        try:
            doc = json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{argv[0]} --json printed invalid JSON: {exc}") from exc
        errs = [e for e in doc.get("errors", []) if e]
        if errs:
            raise SlurmError(f"{argv[0]} --json reported: {errs}")
        return dict(doc)


def _gpus(tres: str | None) -> int:
    """GPU count from ``gres:gpu:2`` / ``gres:gpu:h100:2`` / ``gres/gpu=2`` strings."""
    if not tres:
        return 0
    total = 0
    for part in tres.split(","):
        m = re.search(r"gpu(?::[\w.-]+)?[:=](\d+)", part)
        if m:
            total += int(m.group(1))
    return total


def _gres_indexes(details: list[str]) -> tuple[int, ...]:
    out: list[int] = []
    for d in details:
        m = re.search(r"IDX:([\d,-]+)", d)
        for rng in m.group(1).split(",") if m else []:
            lo, _, hi = rng.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _time(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and v > 0 else None


def _job(j: Mapping[str, Any]) -> JobStatus:
    from gpufleet.hostlist import expand

    slurm_state = str(j.get("job_state", "")).upper()
    state = _STATES.get(slurm_state, JobState.QUEUED)
    restarts = int(j.get("restart_cnt") or 0)
    if state is JobState.QUEUED and restarts > 0:
        state = JobState.REQUEUED
    comment = str(j.get("comment") or "")
    tenant = comment.split("=", 1)[1] if comment.startswith("tenant=") else "default"
    spec = JobSpec(
        name=str(j.get("name") or f"slurm-{j.get('job_id')}"),  # a spec needs a name
        tenant=tenant,
        gpus=_gpus(j.get("tres_per_node")),
        nodes=int(j.get("node_count") or 1),
    )
    nodes = str(j.get("nodes") or "")
    exit_code = j.get("exit_code")
    return JobStatus(
        id=str(j.get("job_id")),
        spec=spec,
        state=state,
        nodes=tuple(expand(nodes)) if nodes else (),
        gpus=_gres_indexes(list(j.get("gres_detail") or [])),
        restarts=restarts,
        exit_code=int(exit_code) if isinstance(exit_code, int) and state.final else None,
        reason=str(j.get("state_reason") or "").replace("None", ""),
        submitted_at_s=_time(j.get("submit_time")),
        started_at_s=_time(j.get("start_time")) if state is not JobState.QUEUED else None,
        ended_at_s=_time(j.get("end_time")) if state.final else None,
    )


def _node(n: Mapping[str, Any]) -> SchedNodeState:
    base = str(n.get("state", "")).lower()
    flags = [str(f).lower() for f in n.get("state_flags") or []]
    words = [base, *flags]
    return SchedNodeState(
        name=str(n.get("name")),
        state="+".join(w for w in words if w),
        reason=str(n.get("reason") or ""),
        gpus_total=_gpus(n.get("gres")),
        gpus_allocated=len(_gres_indexes([str(n.get("gres_used") or "")])),
        schedulable=not any(w in _UNSCHEDULABLE for w in words),
    )
