"""`DeadlineBackend`: per-call NVML deadlines for one-shot commands (issue 14 item 5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.devices.deadline import DeadlineBackend, NvmlTimeoutError, with_deadlines
from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.types import DeviceInfo


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
