"""Alembic environment: runs on the engine the caller put in ``config.attributes['engine']``."""

from __future__ import annotations

from alembic import context

from gpufleet.control.db.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # pragma: no cover - only when someone runs the alembic CLI by hand
    from sqlalchemy import create_engine

    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
