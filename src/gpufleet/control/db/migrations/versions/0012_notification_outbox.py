"""notification_outbox: the controller's notifications, durable until delivered

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07

Issue 29: notifications waited in memory and a controller killed with ``kill -9`` lost them.
One row per (notification, receiver), written in the transaction of the event row that causes
it, pending until a delivery lane sends it or gives up (`gpufleet.control.notify.outbox`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notification_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("notification_id", sa.String(length=96), nullable=False),
        sa.Column("receiver", sa.String(length=200), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=12), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_s", sa.Float(), nullable=False),
        sa.Column("claimed_by", sa.String(length=160), nullable=True),
        sa.Column("claimed_until_s", sa.Float(), nullable=True),
        sa.Column("last_attempt_s", sa.Float(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("done_s", sa.Float(), nullable=True),
        sa.UniqueConstraint("notification_id", "receiver", name="uq_notification_outbox_key"),
    )
    op.create_index(
        "ix_notification_outbox_due",
        "notification_outbox",
        ["receiver", "state", "next_attempt_s"],
    )
    op.create_index("ix_notification_outbox_created", "notification_outbox", ["created_s"])


def downgrade() -> None:
    op.drop_index("ix_notification_outbox_created", table_name="notification_outbox")
    op.drop_index("ix_notification_outbox_due", table_name="notification_outbox")
    op.drop_table("notification_outbox")
