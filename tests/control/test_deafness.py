"""The controller's deaf time (`gpufleet.control.state.deafness`): spans, sums, the loop pulse."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpufleet.control.state.deafness import KEEP_S, DatabaseOutage, DeafTime, pulse
from gpufleet.devices.sim.clock import ManualClock


def test_spans_merge_and_sum_within_a_window() -> None:
    d = DeafTime()
    d.add(10.0, 12.0)
    d.add(11.5, 13.0)  # overlaps the last: merged into 10-13
    d.add(20.0, 21.0)
    d.add(5.0, 5.0)  # empty: ignored
    assert d.within(0.0, 100.0) == pytest.approx(4.0)
    assert d.within(12.0, 20.5) == pytest.approx(1.5)  # 12-13 and 20-20.5
    assert d.within(13.0, 20.0) == 0.0
    assert d.within(30.0, 20.0) == 0.0
    assert d.heard(9.0, 22.0) == pytest.approx(13.0 - 4.0)
    assert d.heard(10.0, 13.0) == 0.0
    d.add(1.0, 2.0)  # out of order (the control loop's late wake told after the pulse's)
    d.add(12.5, 20.5)  # bridges 10-13 and 20-21
    assert d.within(0.0, 100.0) == pytest.approx(1.0 + 11.0)
    assert d.within(0.0, 1.5) == pytest.approx(0.5)


def test_old_spans_are_forgotten() -> None:
    d = DeafTime()
    for i in range(300):  # forgotten in bulk, once there are enough of them
        d.add(i * 1.0, i * 1.0 + 0.5)
    d.add(KEEP_S + 400.0, KEEP_S + 401.0)
    assert d.within(-1.0, 400.0) == 0.0
    assert d.within(KEEP_S, KEEP_S + 500.0) == pytest.approx(1.0)


def test_a_blocked_loop_records_its_late_wake_as_deaf_time() -> None:
    d = DeafTime()

    async def main() -> None:
        task = asyncio.create_task(pulse(d, time.monotonic))
        await asyncio.sleep(0.15)
        time.sleep(0.6)  # the loop cannot run the pulse: at least 0.45 s late
        await asyncio.sleep(0.15)
        task.cancel()

    asyncio.run(main())
    assert d.within(0.0, time.monotonic()) >= 0.45


def test_a_database_outage_is_deaf_from_the_last_stored_write_to_the_last_failure() -> None:
    clock = ManualClock(1000.0)
    deaf = DeafTime()
    outage = DatabaseOutage(deaf, clock)
    outage.ok()  # a group commit stored at 1000
    clock.advance(2.0)
    outage.failed()  # the database away at 1002: deaf since the last stored write
    assert outage.away and deaf.within(990.0, 1010.0) == pytest.approx(2.0)
    clock.advance(3.0)
    outage.failed()  # still away at 1005
    assert deaf.within(990.0, 1010.0) == pytest.approx(5.0)
    clock.advance(1.0)
    outage.ok()  # stored again at 1006: the outage ends there
    assert not outage.away and deaf.within(990.0, 1010.0) == pytest.approx(6.0)
    clock.advance(60.0)
    outage.failed()  # a new outage a minute later looks back at most LOOKBACK_S
    assert deaf.within(1006.0, 1066.0) == pytest.approx(DatabaseOutage.LOOKBACK_S)
