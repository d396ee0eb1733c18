"""energy accounting: energy_minutes, energy_counters

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Issue 16: energy per GPU per minute (counter and power-integral parts, idle share) and each
GPU's newest accounted counter reading, so accounting survives a controller restart.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "energy_minutes",
        sa.Column("node", sa.String(length=253), primary_key=True),
        sa.Column("gpu_index", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("minute_s", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=64), nullable=True),
        sa.Column("window_j", sa.Float(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("fallback_j", sa.Float(), nullable=False),
        sa.Column("power_j", sa.Float(), nullable=False),
        sa.Column("power_s", sa.Float(), nullable=False),
        sa.Column("idle_j", sa.Float(), nullable=False),
        sa.Column("idle_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_energy_minutes_minute", "energy_minutes", ["minute_s"])
    op.create_table(
        "energy_counters",
        sa.Column("node", sa.String(length=253), primary_key=True),
        sa.Column("gpu_index", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("counter_mj", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("energy_counters")
    op.drop_index("ix_energy_minutes_minute", table_name="energy_minutes")
    op.drop_table("energy_minutes")
