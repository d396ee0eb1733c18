"""Chaos: random node failures and scheduler restarts during a stream of short simulated jobs.

Over 50 seeded runs: every job ends exactly once in a final state, none is lost, and no job ever
has two copies running at the same time (every copy's run interval is recorded by the simulated
agents and checked pairwise).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.embedded import (
    EmbeddedScheduler,
    JobStore,
    Launch,
    SimExecutor,
    nodes_from_sim,
)
from tests.hypothesis_budget import seeds


class SchedulerCrash(BaseException):
    """The scheduler process dies here (BaseException: nothing in the engine may swallow it)."""


class CrashingExecutor(SimExecutor):
    """A SimExecutor whose ``start`` can kill the scheduler just before or just after starting."""

    crash_before: bool = False
    crash_after: bool = False

    def start(self, launch: Launch) -> None:
        if self.crash_before:
            self.crash_before = False
            raise SchedulerCrash("before start")
        super().start(launch)
        if self.crash_after:
            self.crash_after = False
            raise SchedulerCrash("after start")


def run_chaos(seed: int, db: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    clock = ManualClock(start_s=1000.0)
    fleet = SimFleet(parse_fleet_spec("3x4xh100-sxm", seed=seed), clock=clock)
    ex = CrashingExecutor(fleet=fleet, lease_s=3.0, clock=clock)
    infos = nodes_from_sim(fleet)
    store = JobStore.open(db)
    finals: Counter[str] = Counter()

    def listen(job_id: str, old: JobState, new: JobState, now: float) -> None:
        if new.final and not old.final:
            finals[job_id] += 1

    def new_engine() -> EmbeddedScheduler:
        return EmbeddedScheduler(store, ex, infos, clock=clock, listener=listen)

    eng = new_engine()
    n_jobs = 14
    submitted: list[str] = []
    broken: dict[str, str] = {}  # node -> "crash" | "cut" | "drain"
    restarts = 0
    for step in range(400):
        if len(submitted) < n_jobs and rng.random() < 0.6:
            spec = JobSpec(
                name=f"j{len(submitted)}",
                tenant=rng.choice(["a", "b"]),
                gpus=rng.choice([1, 1, 2, 4]),
                priority=rng.randrange(3),
                max_restarts=rng.choice([0, 2, 5]),
                checkpoint_dir=f"/ckpt/j{len(submitted)}",
                duration_s=float(rng.randrange(2, 7)),
            )
            submitted.append(eng.submit(spec))
        roll = rng.random()
        healthy = [n for n in fleet.nodes if n not in broken]
        if roll < 0.05 and len(healthy) > 1:
            node = rng.choice(healthy)
            kind = rng.choice(["crash", "cut", "drain"])
            broken[node] = kind
            if kind == "crash":
                ex.crash(node)
                eng.node_lost(node, "heartbeat missed")
            elif kind == "cut":
                ex.partition(node)  # the control plane notices a little later
            else:
                eng.node_drained(node, "XID 79 on a GPU", fail=True)
        elif roll < 0.12 and broken:
            node = rng.choice(sorted(broken))
            kind = broken.pop(node)
            ex.restore(node)
            if kind == "drain":
                eng.node_resumed(node)
            else:
                eng.node_back(node)
        elif roll < 0.17:
            ex.crash_before, ex.crash_after = rng.random() < 0.5, rng.random() < 0.5
        for node, kind in broken.items():
            if kind == "cut" and rng.random() < 0.3:
                eng.node_lost(node, "heartbeat missed")
        try:
            eng.tick()
            if rng.random() < 0.06:
                raise SchedulerCrash("between ticks")
        except SchedulerCrash:
            eng = new_engine()  # the scheduler restarts over the same store
            restarts += 1
        clock.advance(1.0)
        if len(submitted) == n_jobs and all(j.state.final for j in store.jobs()):
            break
        if step == 300:  # wind down: heal everything so the stream can drain
            for node, kind in sorted(broken.items()):
                ex.restore(node)
                if kind == "drain":
                    eng.node_resumed(node)
                else:
                    eng.node_back(node)
            broken.clear()
            ex.crash_before = ex.crash_after = False
    jobs = {j.id: j for j in store.jobs()}
    store.close()
    return {
        "submitted": submitted,
        "jobs": jobs,
        "finals": finals,
        "intervals": ex.intervals,
        "restarts": restarts,
    }


def check_run(result: dict[str, Any]) -> None:
    jobs = result["jobs"]
    assert sorted(jobs) == sorted(result["submitted"]), "a job was lost or invented"
    for job_id, job in jobs.items():
        assert job.state.final, f"job {job_id} never finished: {job.state} {job.reason}"
        assert result["finals"][job_id] == 1, f"job {job_id} ended {result['finals'][job_id]}x"
        assert job.restarts <= job.spec.max_restarts
        assert job.requeues <= job.spec.max_requeues
        assert job.restarts == 0, "simulated jobs exit 0: no restart may be counted"
    per_job: dict[str, list[tuple[float, float]]] = {}
    for iv in result["intervals"]:
        per_job.setdefault(iv.job_id, []).append((iv.start_s, iv.end_s))
    for job_id, ivs in per_job.items():
        ivs.sort()
        for (s0, e0), (s1, _e1) in itertools.pairwise(ivs):
            assert s1 >= e0, f"job {job_id} ran twice at once: {s0}-{e0} and {s1}-"
    for job_id, job in jobs.items():
        if job.state is JobState.SUCCEEDED:
            done = [iv for iv in result["intervals"] if iv.job_id == job_id]
            assert any(iv.how == "completed" for iv in done)


@pytest.mark.parametrize("block", seeds(5, dev_count=2))
def test_chaos_fifty_seeded_runs(tmp_path: Path, block: int) -> None:
    stats: Counter[str] = Counter()
    for seed in range(block * 10, block * 10 + 10):
        result = run_chaos(seed, tmp_path / f"chaos-{seed}.db")
        check_run(result)
        stats["restarts"] += result["restarts"]
        stats["requeues"] += sum(j.requeues for j in result["jobs"].values())
    # The runs must actually exercise restarts and failovers, or they prove nothing.
    assert stats["restarts"] > 0
    assert stats["requeues"] > 0
