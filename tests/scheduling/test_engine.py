"""The embedded engine on simulated nodes: queue, quotas, cancel, failover, fencing, restarts."""

from __future__ import annotations

import pytest

from gpufleet.devices.sim import Fault, FaultKind
from gpufleet.errors import UsageError
from gpufleet.schedulers.base import JobSpec, JobState, UnsupportedFeature
from gpufleet.schedulers.embedded import JobExecutor, Launch
from tests.scheduling.conftest import MakeRig


def test_executor_protocol(make_rig: MakeRig) -> None:
    rig = make_rig()
    assert isinstance(rig.executor, JobExecutor) and rig.executor.confirms_starts is False


def test_submit_refuses_what_capabilities_refuse(make_rig: MakeRig) -> None:
    eng = make_rig().engine()
    with pytest.raises(UnsupportedFeature) as ei:
        eng.submit(JobSpec("img", image="nvcr.io/x:1", duration_s=1))
    assert "image" in str(ei.value) and "kubernetes" in str(ei.value)  # the reason says where
    assert eng.list_jobs() == []


def test_priority_and_quota(make_rig: MakeRig) -> None:
    rig = make_rig("1x3xh100-sxm")
    eng = rig.engine(quotas={"a": 2})
    a1 = eng.submit(JobSpec("a1", tenant="a", gpus=2, duration_s=10))
    a2 = eng.submit(JobSpec("a2", tenant="a", gpus=1, duration_s=10, priority=9))
    b1 = eng.submit(JobSpec("b1", tenant="b", gpus=1, duration_s=10))
    low = eng.submit(JobSpec("low", tenant="b", gpus=1, duration_s=10, priority=-1))
    hi = eng.submit(JobSpec("hi", tenant="b", gpus=1, duration_s=10, priority=5))
    eng.tick()
    state = {j: eng.job(j).state for j in (a1, a2, b1, low, hi)}
    # a2 (priority 9) first; a1 would put tenant a at 1+2 > 2: waits; hi, b1 fill the 3 GPUs.
    assert state[a2] is JobState.RUNNING and state[hi] is JobState.RUNNING
    assert state[a1] is JobState.QUEUED and "quota" in eng.job(a1).reason
    assert state[b1] is JobState.RUNNING and state[low] is JobState.QUEUED
    with pytest.raises(UsageError, match="quota"):
        eng.submit(JobSpec("huge", tenant="a", gpus=3))
    rig.clock.advance(10)
    eng.tick()
    assert eng.job(a2).state is JobState.SUCCEEDED
    assert eng.job(a1).state is JobState.RUNNING  # tenant a is back under its quota


def test_cancel_queued_and_running(make_rig: MakeRig) -> None:
    rig = make_rig("1x4xh100-sxm")
    eng = rig.engine()
    run = eng.submit(JobSpec("run", gpus=4, duration_s=100))
    wait = eng.submit(JobSpec("wait", gpus=4, duration_s=100))
    eng.tick()
    gpu = rig.fleet.node("sim-00").gpus[0]
    assert gpu.load_at(rig.clock()) is not None  # the simulated job loads its GPUs
    eng.cancel(wait)
    eng.cancel(run)
    assert eng.job(run).state is JobState.CANCELLED and eng.job(wait).state is JobState.CANCELLED
    assert gpu.load_at(rig.clock() + 0.01) is None
    assert [iv.how for iv in rig.executor.intervals] == ["killed"]
    eng.cancel(run)  # cancelling a finished job changes nothing
    assert eng.job(run).state is JobState.CANCELLED


def test_fail_drain_requeues_with_checkpoint_and_restart_count(make_rig: MakeRig) -> None:
    rig = make_rig()
    seen: list[Launch] = []
    start = rig.executor.start

    def spy(launch: Launch) -> None:
        seen.append(launch)
        start(launch)

    rig.executor.start = spy  # type: ignore[method-assign]
    eng = rig.engine()
    spec = JobSpec("t", gpus=4, max_requeues=1, checkpoint_dir="/ck/t", duration_s=99)
    jid = eng.submit(spec)
    eng.tick()
    first = eng.job(jid).nodes[0]
    eng.node_drained(first, "XID 79", fail=True)
    assert eng.job(jid).state is JobState.REQUEUED
    eng.tick()
    job = eng.job(jid)
    assert job.state is JobState.RUNNING and job.nodes[0] != first
    assert (job.requeues, job.restarts) == (1, 0)  # infrastructure: not the job's own budget
    assert seen[-1].env["GPUFLEET_RESTART_COUNT"] == "1"
    assert seen[-1].env["GPUFLEET_CHECKPOINT_DIR"] == "/ck/t"
    assert seen[0].env["GPUFLEET_RESTART_COUNT"] == "0"
    eng.node_lost(job.nodes[0])  # second failure: max_requeues=1 is used up
    assert eng.job(jid).state is JobState.FAILED and "max_requeues=1" in eng.job(jid).reason


def test_plain_drain_lets_jobs_finish(make_rig: MakeRig) -> None:
    rig = make_rig("1x4xh100-sxm")
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=1, duration_s=5))
    eng.tick()
    eng.drain("sim-00", "maintenance")
    later = eng.submit(JobSpec("later", gpus=1, duration_s=5))
    rig.clock.advance(5)
    eng.tick()
    assert eng.job(jid).state is JobState.SUCCEEDED
    assert eng.job(later).state is JobState.QUEUED
    assert eng.node_states()[0].state == "drain"
    eng.resume("sim-00")
    eng.tick()
    assert eng.job(later).state is JobState.RUNNING


def test_partitioned_node_fenced_before_restart_and_on_return(make_rig: MakeRig) -> None:
    rig = make_rig(lease_s=3.0)
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=4, max_restarts=3, duration_s=1000))
    eng.tick()
    first = eng.job(jid).nodes[0]
    rig.executor.partition(first)
    rig.clock.advance(1)
    eng.node_lost(first)
    eng.tick()
    assert eng.job(jid).state is JobState.REQUEUED  # the old copy may still run for the lease
    rig.clock.advance(3)
    eng.tick()
    job = eng.job(jid)
    assert job.state is JobState.RUNNING and job.nodes[0] != first
    ivs = sorted(rig.executor.intervals, key=lambda i: i.start_s)
    assert ivs[0].how == "agent lease expired"
    new_start = rig.executor.copies[(jid, job.generation, job.nodes[0])].start_s
    assert new_start >= ivs[0].end_s


def test_node_back_kills_stale_copy(make_rig: MakeRig) -> None:
    rig = make_rig(lease_s=1e9)  # an agent that never self-fences: only node_back can
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=4, max_restarts=3, duration_s=1000))
    eng.tick()
    first = eng.job(jid).nodes[0]
    rig.executor.partition(first)
    eng.node_lost(first)
    rig.executor.restore(first)
    eng.node_back(first)
    stale = [c for k, c in rig.executor.copies.items() if k[2] == first]
    assert stale and all(c.stopped_s is not None and c.reason == "fenced" for c in stale)


def test_xid79_job_failover_via_agent_report(make_rig: MakeRig) -> None:
    """Even before the control plane drains the node, the agent's report moves the job."""
    rig = make_rig()
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=2, max_restarts=2, duration_s=1000))
    eng.tick()
    job = eng.job(jid)
    gpu0 = rig.fleet.node(job.nodes[0]).gpus[0]
    at = rig.clock() - gpu0.t0
    rig.fleet.inject(
        Fault(FaultKind.FALLEN_OFF_BUS, node=job.nodes[0], gpu=job.gpus[0][0], at_s=at)
    )
    rig.clock.advance(1)
    eng.tick()
    eng.tick()
    after = eng.job(jid)
    assert after.state is JobState.RUNNING and after.nodes[0] != job.nodes[0]
    assert job.nodes[0] in after.excluded and (after.requeues, after.restarts) == (1, 0)


def test_restart_adopts_running_and_finishes_once(make_rig: MakeRig) -> None:
    rig = make_rig()
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=1, duration_s=5))
    eng.tick()
    gen = eng.job(jid).generation
    eng2 = rig.engine()  # the scheduler restarts: the copy is confirmed and kept
    assert eng2.job(jid).state is JobState.RUNNING and eng2.job(jid).generation == gen
    rig.clock.advance(5)
    eng2.tick()
    assert eng2.job(jid).state is JobState.SUCCEEDED
    assert len(rig.executor.intervals) == 1


def test_restart_requeues_unconfirmed_start(make_rig: MakeRig) -> None:
    rig = make_rig()
    eng = rig.engine()
    jid = eng.submit(JobSpec("t", gpus=1, duration_s=5))

    class Died(BaseException):
        pass

    def die(launch: Launch) -> None:
        raise Died

    real = rig.executor.start
    rig.executor.start = die  # type: ignore[method-assign]
    with pytest.raises(Died):
        eng.tick()
    stored = rig.store.get(jid)
    assert stored is not None and stored.state is JobState.STARTING
    rig.executor.start = real  # type: ignore[method-assign]
    eng2 = rig.engine()
    assert eng2.job(jid).state is JobState.QUEUED and eng2.job(jid).restarts == 0
    eng2.tick()
    assert eng2.job(jid).state is JobState.RUNNING and eng2.job(jid).generation == 2


def test_a_transition_and_its_attempts_commit_together(make_rig: MakeRig) -> None:
    """A controller killed between writing a requeue and closing the old attempt left an
    attempt that never ended (the chaos test saw ``requeues`` 2 with one ``requeued``
    attempt). Here the attempts table refuses the write, as a crash would cut it: the job row
    must not change either."""
    from sqlalchemy import text

    rig = make_rig()
    eng = rig.engine()
    jid = eng.submit(JobSpec("j", gpus=1, duration_s=100))
    eng.tick()
    before = eng.job(jid)
    assert before.state is JobState.RUNNING
    with rig.store.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TRIGGER cut BEFORE UPDATE ON sched_attempts "
                "BEGIN SELECT RAISE(ABORT, 'controller killed'); END"
            )
        )
    with pytest.raises(Exception, match="controller killed"):
        eng.requeue(jid)
    after = eng.job(jid)
    assert (after.state, after.restarts, after.requeues) == (JobState.RUNNING, 0, 0)
    with rig.store.engine.begin() as conn:
        conn.execute(text("DROP TRIGGER cut"))
    eng.requeue(jid)
    attempts = eng.attempts(jid)
    assert [a.outcome for a in attempts] == ["requeued: requeued by request"]
    assert attempts[0].ended_at is not None
