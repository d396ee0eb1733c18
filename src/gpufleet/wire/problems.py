"""A refused message in one line: the first problem's field path and pydantic's message."""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(exc: ValidationError) -> tuple[str, str]:
    """``(where, message)`` of the first problem: ``where`` is the field path
    (``samples.0.t.3``; ``body`` for the message as a whole); the message says how many more
    problems there are."""
    errs = exc.errors(include_url=False)
    first = errs[0]
    loc = list(first["loc"])
    column = first.get("ctx", {}).get("column")
    if column is not None:  # a sample column of the wrong length: name it in the path
        loc.append(column)
    where = ".".join(map(str, loc)) or "body"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return where, f"{first['msg']}{more}"


def reason(exc: ValidationError) -> str:
    """``"where: message"`` (see `first_problem`)."""
    where, message = first_problem(exc)
    return f"{where}: {message}"
