"""The recurring maintenance policy (issue 15): when the next maintenance occurrence is, and
what campaign the controller proposes for it.

In the controller's policy (``controller --policy FILE``, or ``PUT /api/v1/policy``)::

    maintenance:
      every: quarterly               # quarterly (Jan, Apr, Jul, Oct), monthly, or weekly
      on: first Saturday             # first|second|third|fourth|last WEEKDAY (weekly: WEEKDAY)
      window: "02:00-06:00 Europe/Berlin"
      baseline: baseline.yaml        # a path (next to the policy file) or the baseline inline
      update_command: /usr/local/sbin/site-update
      batch: 5%                      # the campaign's limits, as `gpufleet maintenance start`
      floor: 90%
      propose_days_before: 7         # propose this long before the occurrence opens

An occurrence is the window on the chosen day, in wall-clock time of the zone (daylight-saving
changes follow the zone's rules; a start inside the spring-forward gap is read with the offset
before the change, as `zoneinfo` does). The controller proposes a campaign (state
``proposed``) when some node is out of baseline and the next occurrence opens within
``propose_days_before``; an operator starts it.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufleet.errors import UsageError
from gpufleet.maintenance.baseline import BaselineFile, load_baseline
from gpufleet.maintenance.planner import batch_size, fraction, parse_select
from gpufleet.maintenance.windows import DAYS, Window, parse_window

ORDINALS = {"first": 0, "second": 1, "third": 2, "fourth": 3, "last": -1}
QUARTER_MONTHS = (1, 4, 7, 10)
_LONG = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def parse_on(text: str, every: str) -> tuple[int | None, int]:
    """``first Saturday`` as (0, 5); ``Saturday`` (weekly) as (None, 5)."""
    words = text.lower().split()
    if every == "weekly":
        if len(words) != 1:
            raise ValueError(f"{text!r}: a weekly policy takes a weekday, e.g. 'Saturday'")
        return None, _weekday(words[0], text)
    if len(words) != 2 or words[0] not in ORDINALS:
        raise ValueError(
            f"{text!r}: expected 'ORDINAL WEEKDAY' (first, second, third, fourth or last), "
            "e.g. 'first Saturday'"
        )
    return ORDINALS[words[0]], _weekday(words[1], text)


def _weekday(word: str, text: str) -> int:
    if word in _LONG:
        return _LONG.index(word)
    if word in DAYS:
        return DAYS.index(word)
    raise ValueError(f"{text!r}: {word!r} is not a weekday (Monday..Sunday)")


def nth_weekday(year: int, month: int, ordinal: int, weekday: int) -> date:
    """The ``ordinal``-th (0-based; -1: last) ``weekday`` (0 = Monday) of a month."""
    if ordinal < 0:
        last = date(year, month, calendar.monthrange(year, month)[1])
        return last - timedelta(days=(last.weekday() - weekday) % 7)
    first = date(year, month, 1)
    return first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * ordinal)


class MaintenancePolicy(BaseModel):
    """``maintenance:`` in the controller's policy: when, against what, with which limits."""

    model_config = ConfigDict(extra="forbid")

    every: Literal["quarterly", "monthly", "weekly"] = "quarterly"
    on: str = "first Saturday"
    window: str = Field(description="'HH:MM-HH:MM ZONE', e.g. '02:00-06:00 Europe/Berlin'")
    baseline: BaselineFile = Field(
        description="The baseline inline, or (in a --policy file) a path to baseline.yaml, "
        "relative to the policy file"
    )
    update_command: str = Field(min_length=1, max_length=4096)
    select: str | None = Field(None, description="KEY=GLOB[,...] over node, model, rack")
    batch: str = "5%"
    floor: str = "90%"
    per_domain: int = Field(1, ge=1)
    max_failures: int = Field(2, ge=0)
    validate_level: int = Field(1, ge=0, le=1)
    propose_days_before: float = Field(7.0, ge=0, le=92)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true: take it as ``on``."""
        if isinstance(data, dict) and True in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("on")
    @classmethod
    def _on(cls, value: str, info: ValidationInfo) -> str:
        parse_on(value, info.data.get("every", "quarterly"))
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        words = value.split()
        if len(words) not in (1, 2) or "-" not in words[0]:
            raise ValueError(f"{value!r}: expected 'HH:MM-HH:MM ZONE', e.g. '02:00-06:00 UTC'")
        try:
            parse_window(f"daily {value}")
        except UsageError as exc:
            raise ValueError(str(exc).replace("--window 'daily ", "'")) from None
        return value

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        base = (info.context or {}).get("policy_dir")
        if base is None:
            raise ValueError("give the baseline inline (a path is read only from a --policy file)")
        path = Path(value).expanduser()
        try:
            return load_baseline(path if path.is_absolute() else Path(base) / path)
        except UsageError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("batch")
    @classmethod
    def _batch(cls, value: str) -> str:
        try:
            batch_size(value, 100)
        except UsageError:
            raise ValueError(f"{value!r}: a node count >= 1 or a percentage, e.g. 5%") from None
        return value

    @field_validator("floor")
    @classmethod
    def _floor(cls, value: str) -> str:
        try:
            fraction(value, "floor")
        except UsageError:
            raise ValueError(f"{value!r}: a percentage 0-100% or a fraction 0-1") from None
        return value

    @field_validator("select")
    @classmethod
    def _select(cls, value: str | None) -> str | None:
        try:
            parse_select(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return value

    # -- the schedule ------------------------------------------------------------------------
    def weekly_window(self) -> str:
        """The window as a campaign's weekly ``--window`` (the chosen weekday)."""
        _, weekday = parse_on(self.on, self.every)
        words = self.window.split()
        return f"{DAYS[weekday].title()} {words[0]} {words[1] if len(words) > 1 else 'UTC'}"

    def occurrence_window(self) -> Window:
        return parse_window(self.weekly_window())

    def days(self, after: date) -> list[date]:
        """Occurrence days from the period holding ``after`` onwards (about a year)."""
        ordinal, weekday = parse_on(self.on, self.every)
        if ordinal is None:
            start = after - timedelta(days=1)
            return [
                start + timedelta(days=k)
                for k in range(60)
                if (start + timedelta(days=k)).weekday() == weekday
            ]
        months = QUARTER_MONTHS if self.every == "quarterly" else tuple(range(1, 13))
        out: list[date] = []
        for year in (after.year - 1, after.year, after.year + 1):
            out.extend(nth_weekday(year, m, ordinal, weekday) for m in months)
        return [d for d in out if d >= after - timedelta(days=40)]

    def next_occurrence(self, now: datetime) -> tuple[datetime, datetime]:
        """The next occurrence (UTC start, end) that has not ended at ``now``: the one open
        now, or the next one to open."""
        w = self.occurrence_window()
        tz = w.tz
        for day in self.days(now.astimezone(tz).date()):
            start, end = w.interval(day, tz)
            if end > now:
                return start, end
        raise UsageError("no maintenance occurrence found within a year")  # unreachable

    def spec_body(self, fleet_nodes: int) -> dict[str, Any]:
        """The campaign spec (`CampaignSpec` fields) this policy proposes for a fleet."""
        return {
            "baseline": self.baseline.model_dump(mode="json", exclude_none=True),
            "select": parse_select(self.select),
            "batch": batch_size(self.batch, max(1, fleet_nodes)),
            "floor": fraction(self.floor, "floor"),
            "per_domain": self.per_domain,
            "windows": [self.weekly_window()],
            "max_failures": self.max_failures,
            "update_command": self.update_command,
            "validate_level": self.validate_level,
        }


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)
