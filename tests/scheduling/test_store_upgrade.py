"""A job store made before ``sched_jobs.requeues`` existed keeps working (issue 12): the store
adds the column itself (no Alembic for a standalone `gpufleet jobs` database), old rows read as
0 requeues and keep the ``max_restarts`` they were submitted with."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.embedded.store import JobStore, sched_jobs
from gpufleet.wire.jobs import JOB_SPEC


def test_old_store_gains_requeues_and_keeps_its_jobs(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    old = sa.MetaData()
    columns = [
        sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in sched_jobs.columns
        if c.name != "requeues"
    ]
    sa.Table("sched_jobs", old, *columns)
    old.create_all(engine)
    spec = JOB_SPEC.dump_json(JobSpec("old", max_restarts=0)).decode()
    spec = spec.replace(',"max_requeues":10', "")  # as the old code wrote it
    with engine.begin() as conn:
        conn.execute(
            sa.insert(old.tables["sched_jobs"]).values(
                name="old", tenant="default", spec=spec, state="queued", priority=0,
                restarts=2, generation=0, nodes="[]", gpus="[]", reason="", not_before=0.0,
                excluded="[]",
            )
        )  # fmt: skip
    store = JobStore(engine)
    cols = {c["name"] for c in sa.inspect(engine).get_columns("sched_jobs")}
    assert "requeues" in cols
    job = store.get("1")
    assert job is not None and job.state is JobState.QUEUED
    assert (job.restarts, job.requeues) == (2, 0)
    assert (job.spec.max_restarts, job.spec.max_requeues) == (0, 10)
    assert store.save(job.__class__(**{**job.__dict__, "requeues": 4}), expect_generation=0)
    assert store.get("1").requeues == 4  # type: ignore[union-attr]
    JobStore(engine)  # a second open finds the column present and changes nothing
    store.close()
