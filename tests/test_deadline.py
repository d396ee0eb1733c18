"""`DeadlineBackend`: per-call NVML deadlines for one-shot commands (issue 14 item 5)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpufleet.devices.deadline import (
    DeadlineBackend,
    NvmlTimeoutError,
    _Lane,
    verdict,
    with_deadlines,
)
from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.types import DeviceInfo
from gpufleet.testing.timescale import scaled


@pytest.fixture
def hung_node() -> Iterator[DeadlineBackend]:
    fleet = SimFleet(parse_fleet_spec("1x4xh100"), clock=ManualClock())
    fleet.inject(Fault(FaultKind.HUNG_CALL, gpu=2, at_s=0, params={"seconds": 30}))
    node = next(iter(fleet.nodes.values()))
    yield DeadlineBackend(node.backend(), timeout_s=0.3)
    node.gpus[2].hang_release.set()  # let the hung call return


def test_a_hung_gpu_misses_its_deadline_and_the_others_answer(hung_node: DeadlineBackend) -> None:
    b = hung_node
    try:
        got = b.each("device_info", range(4))
        assert all(isinstance(got[i], DeviceInfo) for i in (0, 1, 3))
        assert isinstance(got[2], NvmlTimeoutError) and got[2].gpu == 2
        assert str(got[2]) == "GPU 2 did not answer NVML within 0.3 s"
        assert b.unresponsive() == {2: "GPU 2 did not answer NVML within 0.3 s"}
        # nothing queues behind the hung call: later calls on the GPU fail at once
        with pytest.raises(NvmlTimeoutError):
            b.sample(2)
        assert b.sample(1).power_w is not None
        assert "GPU 2 did not answer NVML within 0.3 s" in b.problems()
    finally:
        b.close()


def test_with_deadlines_wraps_once(hung_node: DeadlineBackend) -> None:
    assert with_deadlines(hung_node) is hung_node
    hung_node.close()


# ----- a call that never started has not hung (starvation is not a hung GPU) ------------------


def test_verdict_counts_the_deadline_from_the_start_of_the_call() -> None:
    # started late (asked at 0, ran from 4.5 on a starved machine): 4.5 more seconds at 5.0
    assert verdict(now=5.0, timeout_s=5.0, started=4.5, lane_since=None) == pytest.approx(4.5)
    # running for the whole deadline: hung
    assert verdict(now=10.0, timeout_s=5.0, started=5.0, lane_since=None) == 0.0
    # never started, nothing else on its lane: starved, another deadline
    assert verdict(now=50.0, timeout_s=5.0, started=None, lane_since=None) == 5.0
    # never started behind a call that has run past the deadline: hung with it
    assert verdict(now=12.0, timeout_s=5.0, started=None, lane_since=6.0) == 0.0
    # never started behind a call still within its deadline: wait
    assert verdict(now=12.0, timeout_s=5.0, started=None, lane_since=9.0) == 5.0


class _StarvedLane(_Lane):
    """A lane whose thread takes no call until ``gate`` opens: a thread that gets no CPU."""

    gate = threading.Event()

    def _take(self) -> Any:
        self.gate.wait()
        return super()._take()


def test_a_call_starved_past_the_deadline_answers_and_marks_nothing() -> None:
    fleet = SimFleet(parse_fleet_spec("1x2xh100"), clock=ManualClock())
    node = next(iter(fleet.nodes.values()))
    _StarvedLane.gate.clear()
    b = DeadlineBackend(node.backend(), timeout_s=0.2, lane=_StarvedLane)
    got: list[object] = []
    asker = threading.Thread(target=lambda: got.append(_outcome(lambda: b.device_info(1))))
    asker.start()
    try:
        # three deadlines without a thread to run the call: it has not started, so not hung
        asker.join(0.6)
        assert asker.is_alive() and got == [], got
        assert b.unresponsive() == {}
    finally:
        _StarvedLane.gate.set()
        asker.join(scaled(30))
    assert len(got) == 1 and isinstance(got[0], DeviceInfo), got
    assert b.unresponsive() == {}
    b.close()


def test_a_call_queued_behind_a_hung_call_is_hung_with_it(hung_node: DeadlineBackend) -> None:
    b = hung_node
    got: dict[str, object] = {}
    first = threading.Thread(target=lambda: got.update(hung=_outcome(lambda: b.sample(2))))
    first.start()
    # the second call waits on GPU 2's lane behind the hung one: it must not wait forever
    while b._lanes.get(2) is None or b._lanes[2].running is None:
        time.sleep(0.01)
    second = threading.Thread(target=lambda: got.update(queued=_outcome(lambda: b.sample(2))))
    second.start()
    first.join(scaled(30))
    second.join(scaled(30))
    try:
        assert isinstance(got.get("hung"), NvmlTimeoutError), got
        assert isinstance(got.get("queued"), NvmlTimeoutError), got
        assert b.unresponsive() == {2: "GPU 2 did not answer NVML within 0.3 s"}
    finally:
        b.close()


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc
