"""Durable job state for the embedded scheduler (SQLAlchemy 2 Core on its own ``MetaData``).

The store is the truth: the engine writes a state change here *before* acting on it (a job is
``starting`` with its new generation before the executor is asked to start it), so a restarted
engine knows everything the old one decided. Tables are prefixed ``sched_`` so the control plane
can merge them into its own Alembic migrations. SQLite (WAL) by default, any SQLAlchemy URL works.

Every state change of a placed job is a compare-and-set on its ``generation`` (the fence token):
a writer that read an older generation changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.exc import SQLAlchemyError

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.schedulers.base import JobSpec, JobState, JobStatus
from gpufleet.schedulers.embedded.placement import GpuSlot, NodeInfo
from gpufleet.schedulers.embedded.sealing import SpecSealer
from gpufleet.wire.jobs import JOB_SPEC

metadata = MetaData()

sched_jobs = Table(
    "sched_jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("tenant", String(100), nullable=False, index=True),
    Column("spec", Text, nullable=False),  # JSON of the JobSpec
    Column("state", String(20), nullable=False, index=True),
    Column("priority", Integer, nullable=False, default=0),
    Column("restarts", Integer, nullable=False, default=0),  # own non-zero exits restarted
    # infrastructure requeues (node lost, fail finding, fencing); added in migration 0003, and
    # by ``JobStore`` itself to a standalone store made before it (``_add_missing_columns``)
    Column("requeues", Integer, nullable=False, default=0, server_default="0"),
    Column("generation", Integer, nullable=False, default=0),  # fence token of the placement
    Column("nodes", Text, nullable=False, default="[]"),
    Column("gpus", Text, nullable=False, default="[]"),  # per node: a list of GPU indexes
    Column("exit_code", Integer, nullable=True),
    Column("reason", Text, nullable=False, default=""),
    Column("submitted_at", Float, nullable=True),
    Column("started_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Column("not_before", Float, nullable=False, default=0.0),
    Column("excluded", Text, nullable=False, default="[]"),  # nodes where it met a node fault
)

sched_attempts = Table(
    "sched_attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_seq", Integer, nullable=False, index=True),
    Column("generation", Integer, nullable=False),
    Column("nodes", Text, nullable=False),
    Column("gpus", Text, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Column("outcome", String(200), nullable=False, default=""),
)

sched_nodes = Table(
    "sched_nodes",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("state", String(20), nullable=False, default="up"),  # up, drained, lost
    Column("reason", Text, nullable=False, default=""),
    Column("fail", Boolean, nullable=False, default=False),
    Column("info", Text, nullable=False),  # JSON of the NodeInfo
)

sched_quotas = Table(
    "sched_quotas",
    metadata,
    Column("tenant", String(100), primary_key=True),
    Column("gpus", Integer, nullable=False),
)


@dataclass
class JobRow:
    """One job as the store holds it."""

    seq: int
    spec: JobSpec
    state: JobState
    restarts: int = 0
    requeues: int = 0
    generation: int = 0
    nodes: tuple[str, ...] = ()
    gpus: tuple[tuple[int, ...], ...] = ()
    exit_code: int | None = None
    reason: str = ""
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    not_before: float = 0.0
    excluded: tuple[str, ...] = field(default_factory=tuple)

    @property
    def id(self) -> str:
        return str(self.seq)

    def status(self) -> JobStatus:
        flat = tuple(i for per_node in self.gpus for i in per_node)
        return JobStatus(
            id=self.id,
            spec=self.spec,
            state=self.state,
            nodes=self.nodes,
            gpus=flat,
            restarts=self.restarts,
            requeues=self.requeues,
            exit_code=self.exit_code,
            reason=self.reason,
            submitted_at_s=self.submitted_at,
            started_at_s=self.started_at,
            ended_at_s=self.ended_at,
        )


@dataclass(frozen=True)
class NodeRow:
    """A node's inventory and its scheduling state."""

    info: NodeInfo
    state: str = "up"
    reason: str = ""
    fail: bool = False


@dataclass(frozen=True)
class Attempt:
    """One placement of a job: where, when, and how it ended."""

    job_id: str
    generation: int
    nodes: tuple[str, ...]
    started_at: float | None
    ended_at: float | None
    outcome: str


def node_to_json(info: NodeInfo) -> str:
    d = dict(info.__dict__)
    d["gpus"] = [g.__dict__ for g in info.gpus]
    return json.dumps(d, sort_keys=True)


def node_from_json(text: str) -> NodeInfo:
    d = json.loads(text)
    d["gpus"] = tuple(GpuSlot(**g) for g in d["gpus"])
    return NodeInfo(**d)


def _row_to_job(r: Any, sealer: SpecSealer | None = None) -> JobRow:
    spec = sealer.open(r.spec, str(r.seq)) if sealer is not None else r.spec
    return JobRow(
        seq=int(r.seq),
        spec=JOB_SPEC.validate_json(spec),
        state=JobState(r.state),
        restarts=int(r.restarts),
        requeues=int(r.requeues or 0),
        generation=int(r.generation),
        nodes=tuple(json.loads(r.nodes)),
        gpus=tuple(tuple(x) for x in json.loads(r.gpus)),
        exit_code=r.exit_code,
        reason=r.reason or "",
        submitted_at=r.submitted_at,
        started_at=r.started_at,
        ended_at=r.ended_at,
        not_before=float(r.not_before or 0.0),
        excluded=tuple(json.loads(r.excluded or "[]")),
    )


def _job_values(job: JobRow, sealer: SpecSealer | None = None) -> dict[str, Any]:
    spec = JOB_SPEC.dump_json(job.spec).decode()
    return {
        "name": job.spec.name,
        "tenant": job.spec.tenant,
        "spec": sealer.seal(spec) if sealer is not None else spec,
        "state": job.state.value,
        "priority": job.spec.priority,
        "restarts": job.restarts,
        "requeues": job.requeues,
        "generation": job.generation,
        "nodes": json.dumps(list(job.nodes)),
        "gpus": json.dumps([list(g) for g in job.gpus]),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "not_before": job.not_before,
        "excluded": json.dumps(list(job.excluded)),
    }


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


# Columns added after a table first shipped: (table, column, DDL type and default). A store
# made before them (a `gpufleet jobs` state directory, a control plane database not yet
# migrated) gets them here, so an old database keeps working without Alembic.
ADDED_COLUMNS = (("sched_jobs", "requeues", "INTEGER NOT NULL DEFAULT 0"),)


def _add_missing_columns(engine: Engine) -> None:
    names = inspect(engine)
    for table, column, ddl in ADDED_COLUMNS:
        if column not in {c["name"] for c in names.get_columns(table)}:
            with engine.begin() as conn:
                conn.execute(sql_text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}"))


def _open_attempt(conn: Connection, job: JobRow, now: float) -> None:
    conn.execute(
        insert(sched_attempts).values(
            job_seq=job.seq,
            generation=job.generation,
            nodes=json.dumps(list(job.nodes)),
            gpus=json.dumps([list(g) for g in job.gpus]),
            started_at=now,
            ended_at=None,
            outcome="",
        )
    )


def _close_attempt(conn: Connection, job: JobRow, now: float, outcome: str) -> None:
    conn.execute(
        update(sched_attempts)
        .where(sched_attempts.c.job_seq == job.seq)
        .where(sched_attempts.c.generation == job.generation)
        .where(sched_attempts.c.ended_at.is_(None))
        .values(ended_at=now, outcome=outcome)
    )


class JobStore:
    """The embedded scheduler's tables behind a few typed operations."""

    def __init__(self, engine: Engine, sealer: SpecSealer | None = None) -> None:
        self.engine = engine
        self.sealer = sealer  # job specs (their env) sealed at rest (`sealing`)
        try:
            metadata.create_all(engine)
            _add_missing_columns(engine)
        except SQLAlchemyError as exc:
            raise GpufleetError(f"scheduler store {engine.url!r}: {exc}") from exc

    @classmethod
    def open(cls, url_or_path: str | Path) -> JobStore:
        """A store at a SQLAlchemy URL, or at a SQLite file path (its folder is created)."""
        text = str(url_or_path)
        if "://" not in text:
            path = Path(text).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            text = f"sqlite:///{path}"
        try:
            engine = create_engine(text)
        except (SQLAlchemyError, ImportError, ValueError) as exc:
            raise ConfigError(f"scheduler store URL {text!r}: {exc}") from exc
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    # ----- jobs ----------------------------------------------------------------------------
    def add_job(self, job: JobRow) -> JobRow:
        with self.engine.begin() as conn:
            res = conn.execute(insert(sched_jobs).values(**_job_values(job, self.sealer)))
            seq = int(res.inserted_primary_key[0])  # type: ignore[index]
        return replace(job, seq=seq)

    def get(self, job_id: str) -> JobRow | None:
        try:
            seq = int(job_id)
        except ValueError:
            return None
        with self.engine.connect() as conn:
            r = conn.execute(select(sched_jobs).where(sched_jobs.c.seq == seq)).first()
        return _row_to_job(r, self.sealer) if r is not None else None

    def jobs(self, states: Iterable[JobState] | None = None) -> list[JobRow]:
        q = select(sched_jobs).order_by(sched_jobs.c.seq)
        if states is not None:
            q = q.where(sched_jobs.c.state.in_([s.value for s in states]))
        with self.engine.connect() as conn:
            return [_row_to_job(r, self.sealer) for r in conn.execute(q)]

    def save(
        self,
        job: JobRow,
        expect_generation: int,
        *,
        close: tuple[JobRow, float, str] | None = None,
        open_at: float | None = None,
    ) -> bool:
        """Write ``job`` if the stored generation is still ``expect_generation`` (else False),
        in the same transaction closing the attempt of ``close`` = (old row, time, outcome) and
        opening one for ``job`` at ``open_at``: a controller killed half-way leaves no requeued
        job whose attempt never ends, nor a started one without its attempt."""
        with self.engine.begin() as conn:
            res = conn.execute(
                update(sched_jobs)
                .where(sched_jobs.c.seq == job.seq)
                .where(sched_jobs.c.generation == expect_generation)
                .values(**_job_values(job, self.sealer))
            )
            if res.rowcount != 1:
                return False
            if close is not None:
                _close_attempt(conn, *close)
            if open_at is not None:
                _open_attempt(conn, job, open_at)
            return True

    # ----- attempts ------------------------------------------------------------------------
    def open_attempt(self, job: JobRow, now: float) -> None:
        with self.engine.begin() as conn:
            _open_attempt(conn, job, now)

    def close_attempt(self, job: JobRow, now: float, outcome: str) -> None:
        with self.engine.begin() as conn:
            _close_attempt(conn, job, now, outcome)

    def attempts(self, job_id: str) -> list[Attempt]:
        q = (
            select(sched_attempts)
            .where(sched_attempts.c.job_seq == int(job_id))
            .order_by(sched_attempts.c.id)
        )
        with self.engine.connect() as conn:
            return [
                Attempt(
                    job_id=job_id,
                    generation=int(r.generation),
                    nodes=tuple(json.loads(r.nodes)),
                    started_at=r.started_at,
                    ended_at=r.ended_at,
                    outcome=r.outcome,
                )
                for r in conn.execute(q)
            ]

    # ----- nodes and quotas ----------------------------------------------------------------
    def nodes(self) -> dict[str, NodeRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(sched_nodes).order_by(sched_nodes.c.name))
            return {
                r.name: NodeRow(node_from_json(r.info), r.state, r.reason or "", bool(r.fail))
                for r in rows
            }

    def put_node(self, row: NodeRow) -> None:
        values = {
            "state": row.state,
            "reason": row.reason,
            "fail": row.fail,
            "info": node_to_json(row.info),
        }
        with self.engine.begin() as conn:
            res = conn.execute(
                update(sched_nodes).where(sched_nodes.c.name == row.info.name).values(**values)
            )
            if res.rowcount == 0:
                conn.execute(insert(sched_nodes).values(name=row.info.name, **values))

    def quotas(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {r.tenant: int(r.gpus) for r in conn.execute(select(sched_quotas))}

    def set_quota(self, tenant: str, gpus: int | None) -> None:
        with self.engine.begin() as conn:
            conn.execute(sched_quotas.delete().where(sched_quotas.c.tenant == tenant))
            if gpus is not None:
                conn.execute(insert(sched_quotas).values(tenant=tenant, gpus=gpus))
