"""Telling a database that is away (restarting, failing over, unreachable) from a real fault:
what the pool raises then is an operational condition, logged in one line and answered 503,
not a traceback (`gpufleet.control.api.db_errors` makes the answer)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# What SQLAlchemy raises when the server is gone or refuses connections (connection refused,
# "terminating connection due to administrator command", server closed the connection) and
# when no pooled connection frees up in time; IntegrityError and the like are not in it.
DATABASE_AWAY: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)


def database_away(exc: BaseException) -> bool:
    """Is ``exc`` (or what it was raised from) the database being away?"""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DATABASE_AWAY):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (SQLAlchemy's run to dozens, with the SQL)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_failure(log: logging.Logger, what: str, exc: BaseException) -> None:
    """``what`` failed with ``exc``: one warning line when the database is away (it will be
    back, and the pool reconnects by itself), the traceback for anything else."""
    if database_away(exc):
        log.warning("%s: the database is away (%s)", what, first_line(exc))
    else:
        log.error("%s", what, exc_info=exc)
