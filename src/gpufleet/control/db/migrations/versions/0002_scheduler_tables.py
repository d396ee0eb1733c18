"""embedded scheduler tables (sched_*) in the control plane's database

Revision ID: 0002
Revises: 0001
Create Date: 2026-02-01

The embedded scheduler's store (``gpufleet.schedulers.embedded.store``) keeps its own
``MetaData``; this revision creates the same tables so one database (SQLite or PostgreSQL)
holds the fleet and its jobs. Columns match ``store.py`` exactly (the store's ``create_all`` then
finds them present and changes nothing).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sched_jobs",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("gpus", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("not_before", sa.Float(), nullable=False),
        sa.Column("excluded", sa.Text(), nullable=False),
    )
    op.create_index("ix_sched_jobs_tenant", "sched_jobs", ["tenant"])
    op.create_index("ix_sched_jobs_state", "sched_jobs", ["state"])
    op.create_table(
        "sched_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_seq", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("gpus", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=200), nullable=False),
    )
    op.create_index("ix_sched_attempts_job_seq", "sched_attempts", ["job_seq"])
    op.create_table(
        "sched_nodes",
        sa.Column("name", sa.String(length=200), primary_key=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("fail", sa.Boolean(), nullable=False),
        sa.Column("info", sa.Text(), nullable=False),
    )
    op.create_table(
        "sched_quotas",
        sa.Column("tenant", sa.String(length=100), primary_key=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sched_quotas")
    op.drop_table("sched_nodes")
    op.drop_index("ix_sched_attempts_job_seq", table_name="sched_attempts")
    op.drop_table("sched_attempts")
    op.drop_index("ix_sched_jobs_state", table_name="sched_jobs")
    op.drop_index("ix_sched_jobs_tenant", table_name="sched_jobs")
    op.drop_table("sched_jobs")
