"""maintenance campaigns: maint_campaigns, maint_nodes, maint_steps

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Issue 15: campaign state lives in the database so a controller killed at any step resumes
where it was; ``maint_steps`` is unique per (campaign, node, step), the key that keeps a
replayed step from being taken twice.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "maint_campaigns",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("state", sa.String(length=16), nullable=False, index=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_table(
        "maint_nodes",
        sa.Column(
            "campaign_id",
            sa.Integer(),
            sa.ForeignKey("maint_campaigns.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("node", sa.String(length=253), primary_key=True),
        sa.Column("ord", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(length=253), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=16), nullable=False, index=True),
        sa.Column("step_since_s", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=True),
    )
    op.create_table(
        "maint_steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("campaign_id", sa.Integer(), nullable=False, index=True),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("step", sa.String(length=16), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.UniqueConstraint("campaign_id", "node", "step", name="uq_maint_steps_key"),
    )


def downgrade() -> None:
    op.drop_table("maint_steps")
    op.drop_table("maint_nodes")
    op.drop_table("maint_campaigns")
