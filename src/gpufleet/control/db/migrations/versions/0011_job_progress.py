"""job_progress: the progress jobs report (work done so far, in their own unit)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08

Issue 31: a power order's slowdown is the jobs' throughput before against during the order;
jobs report their cumulative work done (``POST /api/v1/energy/progress``) and two readings
give the rate over a window.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("job", sa.String(length=64), primary_key=True),
        sa.Column("t_s", sa.Float(), primary_key=True),
        sa.Column("done", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=True),
    )
    op.create_index("ix_job_progress_t", "job_progress", ["t_s"])


def downgrade() -> None:
    op.drop_index("ix_job_progress_t", table_name="job_progress")
    op.drop_table("job_progress")
