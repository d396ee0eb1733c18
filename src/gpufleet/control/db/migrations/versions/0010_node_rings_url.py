"""nodes.rings_url: which controller replica holds the node's recent raw samples

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

Issue 18: replicas keep the raw samples they ingested in memory (rings). The replica that
ingests a node's batch records its own ``--advertise-url`` here with the node's throttled
heartbeat write, so any other replica can forward a raw series read of that node to it
(`gpufleet.control.series.forward`). NULL: no replica advertised holding them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("rings_url", sa.String(length=2048), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("rings_url")
