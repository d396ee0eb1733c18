"""nodes.host: the node's CPUs and memory as its agent reports them

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Issue 14 item 7: the agent reads the host's CPU topology and memory from /proc and /sys and
sends them with its devices; the control plane keeps them for `gpufleet config slurm
--controller` (NodeName lines with CPUs, Boards, SocketsPerBoard, CoresPerSocket,
ThreadsPerCore, RealMemory). Nodes already in the database have none until their agent reports.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("host", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("host")
