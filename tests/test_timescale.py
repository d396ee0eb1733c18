"""The tests' one time scale factor (`gpufleet.testing.timescale`): read from the environment,
bad values named, and applied to the rigs' condition waits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.errors import UsageError
from gpufleet.testing import timescale
from gpufleet.testing.testbed import wait_for


@pytest.fixture(autouse=True)
def fresh_factor() -> Iterator[None]:
    timescale.time_scale.cache_clear()
    yield
    timescale.time_scale.cache_clear()


def test_the_default_factor_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(timescale.ENV, raising=False)
    assert timescale.scaled(4.0) == 4.0


def test_the_factor_scales_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(timescale.ENV, "2.5")
    assert timescale.scaled(4.0) == 10.0


@pytest.mark.parametrize("raw", ["fast", "0", "-1", "1000", "nan", "inf"])
def test_a_bad_factor_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(timescale.ENV, raw)
    with pytest.raises(UsageError, match=timescale.ENV):
        timescale.time_scale()


def test_wait_for_gives_up_after_the_scaled_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(timescale.ENV, "3")
    polls: list[int] = []
    clock = iter(range(0, 1000))  # one second per reading of the clock

    monkeypatch.setattr("gpufleet.testing.testbed.time.monotonic", lambda: float(next(clock)))
    monkeypatch.setattr("gpufleet.testing.testbed.time.sleep", lambda s: None)
    with pytest.raises(TimeoutError, match="not within 6 s"):
        wait_for(lambda: polls.append(1), 2.0, "never")
    # the deadline is 6 s after the start: the condition was tried until the clock passed it
    assert 6 <= len(polls) <= 8
