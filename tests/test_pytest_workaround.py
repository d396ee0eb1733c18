"""The suite's guard against CPython 3.11's spurious AST SystemError (tests/conftest.py): a
failing test's source that cannot be parsed must fall back to pytest's unparsable-source path,
not end the run."""

from __future__ import annotations

from typing import Any

import pytest
from _pytest._code import code

from tests.conftest import tolerant_parse


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
