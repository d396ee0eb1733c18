"""embedded scheduler: sched_jobs.requeues (infrastructure requeues, apart from restarts)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Issue 12: ``restarts`` counts only the job's own non-zero exits (``max_restarts``); requeues
for node loss, fail findings and fencing are counted in ``requeues`` (``max_requeues``). Jobs
already in the database start at 0. A store that already added the column itself (the
standalone ``JobStore`` does so for old databases) is left as it is.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _has_requeues() -> bool:
    cols = sa.inspect(op.get_bind()).get_columns("sched_jobs")
    return any(c["name"] == "requeues" for c in cols)


def upgrade() -> None:
    if not _has_requeues():
        op.add_column(
            "sched_jobs",
            sa.Column("requeues", sa.Integer(), nullable=False, server_default="0"),
        )


def downgrade() -> None:
    with op.batch_alter_table("sched_jobs") as batch:
        batch.drop_column("requeues")
