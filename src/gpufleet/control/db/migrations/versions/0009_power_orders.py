"""power orders: power_orders, power_order_nodes

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Issue 16: a fleet-wide power order lives in the database so a controller killed between the
order and the agents' answers sends it again on restart; (order, node) is the key the agent
acts on once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "power_orders",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("state", sa.String(length=16), nullable=False, index=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("revert_at_s", sa.Float(), nullable=True),
        sa.Column("restore_s", sa.Float(), nullable=True),
        sa.Column("restore_by", sa.String(length=128), nullable=True),
    )
    op.create_table(
        "power_order_nodes",
        sa.Column(
            "order_id",
            sa.Integer(),
            sa.ForeignKey("power_orders.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("node", sa.String(length=253), primary_key=True),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("applied", sa.JSON(), nullable=True),
        sa.Column("applied_s", sa.Float(), nullable=True),
        sa.Column("restored", sa.JSON(), nullable=True),
        sa.Column("restored_s", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("power_order_nodes")
    op.drop_table("power_orders")
