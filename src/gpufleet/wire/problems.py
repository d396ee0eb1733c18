"""A refused message in one line: the first problem's field path and pydantic's message (a
``schema_version`` newer than this code knows comes first, saying so); `problem_extra` adds
the same as data to a problem body, so an agent reads "the control plane is older than me"
from fields, not from the sentence."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gpufleet.wire.limits import SCHEMA_VERSION


def first_problem(exc: ValidationError) -> tuple[str, str]:
    """``(where, message)`` of the first problem: ``where`` is the field path
    (``samples.0.t.3``; ``body`` for the message as a whole); the message says how many more
    problems there are."""
    errs = exc.errors(include_url=False)
    newer = next((e for e in errs if _newer_schema(e)), None)
    if newer is not None:  # a newer agent's batch: say so first, whatever else it holds
        return "schema_version", (
            f"{newer['input']} is newer than this control plane knows ({SCHEMA_VERSION}): "
            "upgrade the control plane before its agents"
        )
    first = errs[0]
    loc = list(first["loc"])
    column = first.get("ctx", {}).get("column")
    if column is not None:  # a sample column of the wrong length: name it in the path
        loc.append(column)
    where = ".".join(map(str, loc)) or "body"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return where, f"{first['msg']}{more}"


def _newer_schema(err: Any) -> bool:
    """A ``schema_version`` past the one this code knows (a message from a newer release)."""
    value = err.get("input")
    return (
        tuple(err["loc"]) == ("schema_version",) and type(value) is int and value > SCHEMA_VERSION
    )


PROBLEM_FIELD = "field"  # a problem body's member: the first problem's field path
SCHEMA_SUPPORTED = "schema_version_supported"  # with field schema_version: what this code speaks


def problem_extra(exc: ValidationError) -> dict[str, Any]:
    """Members a problem body carries beside ``detail``: ``field`` (`first_problem`'s path) and,
    when that is ``schema_version``, ``schema_version_supported`` (this code's
    `SCHEMA_VERSION`)."""
    where, _ = first_problem(exc)
    if where == "schema_version":
        return {PROBLEM_FIELD: where, SCHEMA_SUPPORTED: SCHEMA_VERSION}
    return {PROBLEM_FIELD: where}


def reason(exc: ValidationError) -> str:
    """``"where: message"`` (see `first_problem`)."""
    where, message = first_problem(exc)
    return f"{where}: {message}"
