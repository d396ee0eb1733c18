"""ingest key includes the node; audit rows carry the tenant; tokens carry their owner

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- ``ingested_batches``: the primary key becomes (node, agent_id, seq). With (agent_id, seq)
  alone, a token bound to one node that reused another node's agent id made that node's real
  batches count as duplicates. The table is rebuilt (rows kept): SQLite cannot change a primary
  key in place.
- ``audit_log.tenant``: the acting token's tenant, so a tenant token reads only its own rows.
- ``api_tokens.owner``: what made the token when a program owns it (``up``), so `gpufleet up`
  revokes its own tokens, never an admin's that happen to share a name.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_BATCH_COLUMNS = (
    "node, agent_id, seq, received_s, sent_at_s, samples, findings, events, buffered, token_id"
)


def _batches_table(name: str, key: tuple[str, ...]) -> None:
    op.create_table(
        name,
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("received_s", sa.Float(), nullable=False),
        sa.Column("sent_at_s", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("findings", sa.Integer(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("buffered", sa.Boolean(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint(*key),
    )


def _rekey_batches(key: tuple[str, ...], dedupe: bool) -> None:
    _batches_table("ingested_batches_new", key)
    select = f"SELECT {_BATCH_COLUMNS} FROM ingested_batches"
    if dedupe:  # going back to (agent_id, seq): keep one row per old key
        select += (
            " WHERE (agent_id, seq, node) IN (SELECT agent_id, seq, MIN(node)"
            " FROM ingested_batches GROUP BY agent_id, seq)"
        )
    op.execute(f"INSERT INTO ingested_batches_new ({_BATCH_COLUMNS}) {select}")
    op.drop_index("ix_ingested_batches_received_s", table_name="ingested_batches")
    op.drop_table("ingested_batches")
    op.rename_table("ingested_batches_new", "ingested_batches")
    op.create_index(
        "ix_ingested_batches_received_s", "ingested_batches", ["received_s"], unique=False
    )


def upgrade() -> None:
    _rekey_batches(("node", "agent_id", "seq"), dedupe=False)
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_audit_log_tenant"), ["tenant"], unique=False)
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("owner")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_tenant"))
        batch_op.drop_column("tenant")
    _rekey_batches(("agent_id", "seq"), dedupe=True)
