"""The suite's guard against CPython 3.11's spurious AST SystemError (tests/conftest.py): a
failing test's source that cannot be parsed must fall back to pytest's unparsable-source path,
not end the run."""

from __future__ import annotations

from typing import Any

import pytest
from _pytest._code import code

from tests.conftest import retrying_on_ast_race, tolerant_parse


def test_the_guard_is_installed_on_pytests_source_parser() -> None:
    assert getattr(getattr(code, "getstatementrange_ast"), "tolerant", False)  # noqa: B009


def test_a_spurious_systemerror_is_retried() -> None:
    calls: list[int] = []

    def flaky(*_a: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=147, after=52)")
        return "parsed"

    assert tolerant_parse(flaky)(3, "src") == "parsed"
    assert len(calls) == 2


def test_a_lasting_systemerror_becomes_the_syntaxerror_pytest_handles() -> None:
    def broken(*_a: Any) -> str:
        raise SystemError("AST constructor recursion depth mismatch")

    with pytest.raises(SyntaxError, match="recursion depth mismatch"):
        tolerant_parse(broken, tries=2)(3, "src")


def test_the_import_rewrite_is_retried_on_the_race_and_anyio_is_imported_eagerly() -> None:
    import sys

    from _pytest.assertion import rewrite

    assert getattr(getattr(rewrite, "_rewrite_test"), "tolerant", False)  # noqa: B009
    assert "anyio._core._fileio" in sys.modules  # what starlette's FileResponse reached lazily


def test_a_rewrite_interrupted_once_by_the_race_is_retried_other_errors_are_not() -> None:
    calls: list[int] = []

    def flaky(*_a: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=63, after=53)")
        return "code"

    assert retrying_on_ast_race(flaky)("fn", "config") == "code" and len(calls) == 2

    def other(*_a: Any) -> str:
        raise SystemError("something else")

    with pytest.raises(SystemError, match="something else"):
        retrying_on_ast_race(other)()

    def lasting(*_a: Any) -> str:
        raise SystemError("AST constructor recursion depth mismatch")

    with pytest.raises(SystemError, match="mismatch"):
        retrying_on_ast_race(lasting, tries=2)()
