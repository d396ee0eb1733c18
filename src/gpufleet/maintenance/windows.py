"""Maintenance windows: when a campaign may start work on a node.

A window is written as operators say it, ``DAYS HH:MM-HH:MM ZONE``:

- ``Sat 02:00-06:00 Europe/Berlin``: every Saturday, four hours, Berlin wall-clock time
  (daylight-saving changes follow the zone's rules, `zoneinfo`);
- ``Sat,Sun 22:00-04:00 UTC``: a window that crosses midnight belongs to the day it starts;
- ``Mon-Fri 01:00-03:00 America/New_York``: a range of days;
- ``daily 00:00-24:00 UTC`` or ``always``: no restriction.

Several windows may be given; a time is inside the schedule when it is inside any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpufleet.errors import UsageError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALL_DAYS = frozenset(range(7))
_SEARCH_DAYS = 15  # a weekly schedule repeats within 7 days; 15 covers a crossing window


@dataclass(frozen=True)
class Window:
    """One recurring window: weekdays (0 = Monday) on which it starts, its local start and
    end, and its time zone."""

    days: frozenset[int]
    start: time
    end: time | None  # None: ends at 24:00
    zone: str
    text: str

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    def intervals(self, around: datetime) -> list[tuple[datetime, datetime]]:
        """The UTC intervals of this window starting from one day before ``around`` to
        `_SEARCH_DAYS` days after, in order."""
        tz = self.tz
        local_day = around.astimezone(tz).date()
        out = []
        for offset in range(-1, _SEARCH_DAYS):
            day = local_day + timedelta(days=offset)
            if day.weekday() not in self.days:
                continue
            out.append(self.interval(day, tz))
        return out

    def interval(self, day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
        """The UTC span of the window that starts on the local ``day``."""
        start = datetime.combine(day, self.start, tzinfo=tz)
        if self.end is None:
            end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=tz)
        elif self.end > self.start:
            end = datetime.combine(day, self.end, tzinfo=tz)
        else:  # crosses midnight
            end = datetime.combine(day + timedelta(days=1), self.end, tzinfo=tz)
        return start.astimezone(UTC), end.astimezone(UTC)


@dataclass(frozen=True)
class Schedule:
    """Windows together (an empty schedule is always open)."""

    windows: tuple[Window, ...] = ()

    @property
    def always(self) -> bool:
        return not self.windows

    def intervals(self, t: datetime) -> list[tuple[datetime, datetime]]:
        """The merged UTC spans of every window from a day before ``t`` to about two weeks
        after, in order."""
        spans = sorted(s for w in self.windows for s in w.intervals(t))
        merged: list[tuple[datetime, datetime]] = []
        for a, b in spans:  # back-to-back or overlapping windows are one span
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def open_until(self, t: datetime) -> datetime | None:
        """When the window ``t`` lies in closes (None: ``t`` is outside every window).
        An always-open schedule returns `datetime.max` in UTC."""
        if self.always:
            return datetime.max.replace(tzinfo=UTC)
        for a, b in self.intervals(t):
            if a <= t < b:
                return b
        return None

    def next_open(self, t: datetime) -> datetime:
        """``t`` itself when inside a window, else when the next window opens."""
        if self.always:
            return t
        for a, b in self.intervals(t):
            if a <= t < b:
                return t
            if a > t:
                return a
        raise UsageError(f"no maintenance window opens within {_SEARCH_DAYS} days of {t:%F}")


def _days(text: str, spec: str) -> frozenset[int]:
    if text.lower() in ("daily", "every", "*"):
        return ALL_DAYS
    days: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.lower().partition("-")
        try:
            a = DAYS.index(lo[:3])
            b = DAYS.index(hi[:3]) if hi else a
        except ValueError:
            raise UsageError(
                f"--window {spec!r}: {part!r} is not a day (Mon..Sun, a range Mon-Fri, a list"
                " Sat,Sun, or daily)"
            ) from None
        if lo[3:] and DAYS[a] + lo[3:] not in _LONG_DAYS:
            raise UsageError(f"--window {spec!r}: {lo!r} is not a day")
        i = a
        while True:
            days.add(i)
            if i == b:
                break
            i = (i + 1) % 7
    return frozenset(days)


_LONG_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _clock(text: str, spec: str) -> time | None:
    hh, sep, mm = text.partition(":")
    if not sep or not hh.isdigit() or not mm.isdigit() or len(mm) != 2:
        raise UsageError(f"--window {spec!r}: {text!r} is not a time HH:MM")
    h, m = int(hh), int(mm)
    if (h, m) == (24, 0):
        return None
    if h > 23 or m > 59:
        raise UsageError(f"--window {spec!r}: {text!r} is not a time of day")
    return time(h, m)


def parse_window(spec: str) -> Window:
    """One window from ``DAYS HH:MM-HH:MM ZONE`` (the zone defaults to UTC); a clear error
    naming the part that is wrong."""
    words = spec.split()
    if words == ["always"]:
        return Window(ALL_DAYS, time(0), None, "UTC", spec)
    if len(words) not in (2, 3):
        raise UsageError(
            f"--window {spec!r}: expected 'DAYS HH:MM-HH:MM ZONE', e.g. 'Sat 02:00-06:00 "
            "Europe/Berlin'"
        )
    zone = words[2] if len(words) == 3 else "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise UsageError(
            f"--window {spec!r}: unknown time zone {zone!r} (an IANA name such as Europe/Berlin)"
        ) from None
    start_text, dash, end_text = words[1].partition("-")
    if not dash:
        raise UsageError(f"--window {spec!r}: expected a span HH:MM-HH:MM, got {words[1]!r}")
    start = _clock(start_text, spec)
    if start is None:
        raise UsageError(f"--window {spec!r}: a window cannot start at 24:00")
    end = _clock(end_text, spec)
    if end == start:
        raise UsageError(f"--window {spec!r}: the window is empty (start equals end)")
    return Window(_days(words[0], spec), start, end, zone, spec)


def parse_schedule(specs: list[str] | None) -> Schedule:
    """All ``--window`` options together."""
    return Schedule(tuple(parse_window(s) for s in specs or ()))
