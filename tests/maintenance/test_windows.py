"""Maintenance windows: wall-clock times in their zone, DST, midnight-crossing, clear errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.errors import UsageError
from gpufleet.maintenance.windows import parse_schedule, parse_window


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_berlin_saturday_window_in_winter_is_utc_plus_one() -> None:
    # 2026-12-05 is a Saturday; Berlin is UTC+1 in December (CET).
    s = parse_schedule(["Sat 02:00-06:00 Europe/Berlin"])
    assert s.next_open(utc("2026-12-01T00:00")) == utc("2026-12-05T01:00")
    assert s.open_until(utc("2026-12-05T01:00")) == utc("2026-12-05T05:00")
    assert s.open_until(utc("2026-12-05T05:00")) is None  # the end is outside
    assert s.open_until(utc("2026-12-05T00:59")) is None


def test_berlin_saturday_window_in_summer_is_utc_plus_two() -> None:
    # 2026-07-04 is a Saturday; Berlin is UTC+2 in July (CEST).
    s = parse_schedule(["Sat 02:00-06:00 Europe/Berlin"])
    assert s.next_open(utc("2026-07-01T00:00")) == utc("2026-07-04T00:00")
    assert s.open_until(utc("2026-07-04T03:59")) == utc("2026-07-04T04:00")


def test_window_across_the_spring_forward_night_is_one_hour_shorter() -> None:
    # 2026-03-29 (Sunday): Berlin clocks jump 02:00 CET -> 03:00 CEST. 01:00-04:00 local
    # is 00:00-02:00 UTC: two hours, not three.
    s = parse_schedule(["Sun 01:00-04:00 Europe/Berlin"])
    start = s.next_open(utc("2026-03-28T12:00"))
    assert start == utc("2026-03-29T00:00")
    assert s.open_until(start) == utc("2026-03-29T02:00")


def test_window_crossing_midnight_belongs_to_its_start_day() -> None:
    s = parse_schedule(["Fri 22:00-02:00 UTC"])  # 2026-12-04 is a Friday
    assert s.open_until(utc("2026-12-05T01:30")) == utc("2026-12-05T02:00")
    assert s.open_until(utc("2026-12-05T02:30")) is None
    assert s.next_open(utc("2026-12-05T02:30")) == utc("2026-12-11T22:00")


def test_day_ranges_lists_and_midnight_end() -> None:
    w = parse_window("Mon-Wed,Sat 00:00-24:00 UTC")
    assert w.days == {0, 1, 2, 5}
    s = parse_schedule(["Mon-Wed,Sat 00:00-24:00 UTC"])
    # 2026-11-30 is a Monday: Mon..Wed back to back merge into one span ending Thursday 00:00.
    assert s.open_until(utc("2026-11-30T10:00")) == utc("2026-12-03T00:00")
    assert parse_window("fri-mon 01:00-02:00").days == {4, 5, 6, 0}  # wraps past Sunday


def test_no_window_means_always_open() -> None:
    s = parse_schedule([])
    t = utc("2026-12-01T12:34")
    assert s.next_open(t) == t
    assert s.open_until(t) is not None


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("Sat 02:00-06:00 Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("Sta 02:00-06:00 UTC", "'Sta' is not a day"),
        ("Sat 2am-6am UTC", "'2am' is not a time HH:MM"),
        ("Sat 02:00-25:00 UTC", "'25:00' is not a time of day"),
        ("Sat 02:00-02:00 UTC", "empty"),
        ("Sat 02:00 UTC", "expected a span"),
        ("Saturday", "expected 'DAYS HH:MM-HH:MM ZONE'"),
    ],
)
def test_bad_windows_name_the_part_that_is_wrong(spec: str, needle: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_window(spec)
    assert needle in err.value.message
    assert spec in err.value.message
