"""`gpufleet.svgchart`: human-readable values, round ticks, and no empty charts."""

from __future__ import annotations

import pytest

from gpufleet.svgchart import (
    Series,
    bar_chart,
    fmt_bytes,
    fmt_money,
    fmt_num,
    line_chart,
    nice_ticks,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [(8 * 2**30, "8 GiB"), (1536 * 2**10, "1.5 MiB"), (512, "512 B"), (2**40 * 3, "3 TiB")],
)
def test_bytes_in_binary_units(value: float, text: str) -> None:
    assert fmt_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(84.8e6, "$84.8M"), (1.2e9, "$1.2B"), (950_000, "$950k"), (12, "$12"), (-3e6, "-$3M")],
)
def test_money_short_form(value: float, text: str) -> None:
    assert fmt_money(value) == text


def test_plain_figures() -> None:
    assert [fmt_num(v) for v in (1234.5, 450.2, 12.25, 0.42, 0)] == [
        "1,234",
        "450",
        "12.2",
        "0.42",
        "0",
    ]


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 84.8e6, 4) == [0, 25e6, 50e6, 75e6, 100e6]
    assert nice_ticks(0, 360, 5) == [0, 100, 200, 300, 400]
    flat = nice_ticks(0, 0)  # a flat series still gets an axis
    assert flat[0] == 0 and flat[-1] == 1.0


def test_no_data_no_chart() -> None:
    assert bar_chart("t", [], value_label="W") == ""
    assert line_chart("t", [Series("a", [1, 2], [None, None])], x_label="x", y_label="y") == ""
    svg = line_chart(
        "t", [Series("a", [0, 12], [0, 5e6])], x_label="months", y_label="USD",
        y_fmt=fmt_money, markers=[(6, "break-even: month 6")],
    )  # fmt: skip
    assert "$5M" in svg and "break-even: month 6" in svg and 'class="marker"' in svg
