"""Alembic migrations of the control-plane schema (run by `gpufleet controller migrate`)."""
