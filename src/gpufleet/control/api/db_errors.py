"""A database that is away (restarting, failing over, unreachable) is a 503 with
``Retry-After``, never a 500: agents keep their batches and push again, CLI users read why.
SQLAlchemy's pool (``pool_pre_ping``) reconnects by itself once the database is back."""

from __future__ import annotations

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# What SQLAlchemy raises when the server is gone or refuses connections (connection refused,
# "terminating connection due to administrator command", server closed the connection) and
# when no pooled connection frees up in time; IntegrityError and the like are not in it.
DATABASE_AWAY: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)
RETRY_AFTER_S = 2
DETAIL = "the database is unavailable (restarting or unreachable): nothing was stored; retry"
