"""leader lease: leader_lease

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Issue 18: several controller replicas on one PostgreSQL elect one leader through this one-row
table (`gpufleet.control.ha.leader`): ``holder`` and ``expires_s`` say who leads until when,
``epoch`` (the fencing token) grows by one at every change of holder, and every transaction of
the leader's periodic work checks it first, so a leader that lost its lease writes nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_s", sa.Float(), nullable=False),
        sa.Column("acquired_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_lease")
