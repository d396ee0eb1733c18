"""How closed minutes reach the rollup table (issue 29), on SQLite and PostgreSQL: written at the
service's first tick after the minute ends and its grace passed, late samples merged into the
stored row (also one another process wrote), a fleet's minute written in steps of one
transaction each, and a write that fails kept in memory for the next flush."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from gpufleet.control.db.models import Rollup
from gpufleet.control.series import rollups
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.devices.sim import ManualClock
from tests.control.conftest import T0, batch, push, ungated

MINUTE = int(T0 // 60 * 60)  # T0 is 20 s into this minute


def service(db: dict[str, Any], clock: ManualClock) -> ControlService:
    svc = ControlService(ServiceConfig(**db, policy=ungated(None)), clock=clock)
    svc.ingest.start()
    return svc


def stored(svc: ControlService) -> dict[tuple[str, int, int], tuple[int, list[float]]]:
    with svc.store.sessions() as s:
        return {
            (r.node, r.gpu_index, r.minute_s): (r.samples, r.stats["gpu_util_pct"])
            for r in s.scalars(select(Rollup))
        }


def stats(values: list[float]) -> list[float]:
    return [len(values), min(values), sum(values) / len(values), max(values)]


def close(got: list[float], want: list[float]) -> bool:
    return all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(got, want, strict=True))


def test_a_minute_is_written_when_it_ends_and_late_samples_merge(
    db_config: dict[str, Any], tmp_path: Path
) -> None:
    clock = ManualClock(T0)
    svc = service(db_config, clock)
    try:
        # batch(): GPU g's utilisation is 10 g + i for sample i, at T0 + i
        push(svc, batch("n1", 1, k=3))  # T0..T0+2
        svc.tick()
        assert stored(svc) == {}  # the minute is still open
        clock.advance(41)  # T0 + 41: the minute ended 1 s ago, inside the grace
        svc.tick()
        assert stored(svc) == {}
        clock.advance(rollups.CLOSE_GRACE_S)  # the grace has passed: written
        svc.tick()
        assert stored(svc)[("n1", 1, MINUTE)] == (3, [3, 10.0, 11.0, 12.0])
        # a batch straddling the minute's end: its first samples belong to the written minute
        push(svc, batch("n1", 2, t=T0 + 38, k=4, devices=False))  # T0+38..41
        clock.advance(rollups.FLUSH_S)
        svc.tick()
        rows = stored(svc)
        assert rows[("n1", 1, MINUTE)][0] == 5
        assert close(rows[("n1", 1, MINUTE)][1], stats([10, 11, 12, 10, 11]))
        assert ("n1", 1, MINUTE + 60) not in rows  # that one is open
    finally:
        svc.ingest.stop()  # as kill -9: no final flush
        svc.engine.dispose()
    # another process on the same database: its late samples merge with the killed one's row
    again = service(db_config, clock)
    try:
        push(again, batch("n1", 3, t=T0 + 30, k=2, devices=False))  # T0+30, 31: util 10, 11
        again.flush_rollups()
        samples, util = stored(again)[("n1", 1, MINUTE)]
        assert samples == 7 and close(util, stats([10, 11, 12, 10, 11, 10, 11]))
    finally:
        again.stop()


def test_a_fleet_minute_is_written_in_steps(
    make_service: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = make_service()
    for i in range(5):
        push(svc, batch(f"n{i}", 1, gpus=2))
    clock.advance(60)
    monkeypatch.setattr(rollups, "STEP_ROWS", 4)  # two nodes' rows a step
    steps: list[int] = []

    def call(fn: Any) -> Any:
        n, more = svc.store.writer.call(fn)
        steps.append(n)
        return n, more

    assert rollups.flush_closed(svc.store, call) == 10
    assert steps == [4, 4, 2]
    assert len(stored(svc)) == 10


def test_a_failed_write_keeps_the_minutes_for_the_next_flush(
    db_config: dict[str, Any],
) -> None:
    clock = ManualClock(T0)
    svc = service(db_config, clock)
    try:
        push(svc, batch("n1", 1, k=3))
        clock.advance(200)  # past the old 90 s lateness too: the old flush lost the minute

        def rename(a: str, b: str) -> None:
            with svc.store.sessions.begin() as s:
                s.execute(text(f"ALTER TABLE {a} RENAME TO {b}"))

        rename("rollups", "rollups_away")  # the write fails as with the database away
        with pytest.raises(Exception, match="rollups"):
            svc.flush_rollups()
        rename("rollups_away", "rollups")
        push(svc, batch("n1", 2, t=T0 + 3, k=1, devices=False))  # late, meanwhile
        assert svc.flush_rollups() == 2
        samples, util = stored(svc)[("n1", 1, MINUTE)]
        assert samples == 4 and close(util, stats([10, 11, 12, 10]))
    finally:
        svc.stop()
