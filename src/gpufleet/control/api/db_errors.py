"""A database that is away (restarting, failing over, unreachable) is a 503 with
``Retry-After``, never a 500: agents keep their batches and push again, CLI users read why.
SQLAlchemy's pool (``pool_pre_ping``) reconnects by itself once the database is back."""

from __future__ import annotations

from gpufleet.control.db.away import DATABASE_AWAY

__all__ = ["DATABASE_AWAY", "DETAIL", "RETRY_AFTER_S"]
RETRY_AFTER_S = 2
DETAIL = "the database is unavailable (restarting or unreachable): nothing was stored; retry"
