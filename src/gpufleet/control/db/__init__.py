"""The database: engine and URL, SQLAlchemy models, Alembic migrations, backup and restore."""
