"""Thresholds files (``gpufleet validate --config``) checked by pydantic models: one error
naming the file, line and field, with a did-you-mean for a misspelt key or test name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.validate.thresholds import load_thresholds, parse_thresholds
from tests.file_errors import assert_file_error


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # misspelt keys and names
        (
            "defaults:\n  pass_fractio: 0.8\n",
            ":2: defaults.pass_fractio: unknown field 'pass_fractio'"
            " (did you mean 'pass_fraction'?)",
        ),
        ("straggler_zz: 3\n", ":1: straggler_zz: unknown field 'straggler_zz' (did you mean"),
        (
            "tests:\n  matmul: {}\n  matmull: {pass_fraction: 0.8}\n",
            ":3: tests.matmull: unknown test 'matmull' (did you mean 'matmul'?)",
        ),
        # wrong types
        ("straggler_z: high\n", ":1: straggler_z: expected a number, got 'high'"),
        ("expect_mig: 1\n", ":1: expect_mig: expected true or false, got 1"),
        ("tests:\n  matmul: 0.5\n", ":2: tests.matmul: expected a mapping, got 0.5"),
        ("retired_pages_limit: 6.5\n", ":1: retired_pages_limit: expected a whole number"),
        # out of range, and lines that contradict each other
        (
            "defaults:\n  pass_fraction: 2\n",
            ":2: defaults.pass_fraction: must be at most 1.5, got 2",
        ),
        (
            "defaults: {pass_fraction: 0.9}\ntests:\n  matmul: {warn_fraction: 0.5}\n",
            ":3: tests.matmul.warn_fraction: warn_fraction 0.5 must be >= pass_fraction 0.9",
        ),
    ],
)
def test_one_error_names_file_line_and_field(tmp_path: Path, body: str, expected: str) -> None:
    assert_file_error(tmp_path / "thr.yaml", body, load_thresholds, expected)


def test_nothing_is_required_unset_lines_inherit() -> None:
    """A thresholds file has no required field: an empty test entry takes the defaults."""
    thr = parse_thresholds(
        "defaults: {pass_fraction: 0.7, warn_fraction: 0.8}\ntests:\n  matmul:\n"
    )
    assert thr.limits("matmul").pass_fraction == 0.7
    assert thr.limits("matmul").warn_fraction == 0.8
    assert parse_thresholds("").limits("matmul").pass_fraction == 0.9


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such thresholds file"):
        load_thresholds(tmp_path / "nope.yaml")
