"""The production NVML backend over the simulator: identity, NotSupported, FunctionNotFound,
lost GPUs, hung calls, XID events and every injected fault as NVML reports it."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from gpufleet.devices.nvml import NvmlBackend
from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.sim.nvml_api import SimNvml
from gpufleet.devices.types import ClockEventReason
from gpufleet.errors import GpuLostError, NoDeviceError


def make(spec: str = "1x4xh100-sxm", seed: int = 7) -> tuple[SimFleet, ManualClock]:
    clock = ManualClock()
    return SimFleet(parse_fleet_spec(spec, seed=seed), clock=clock), clock


def test_device_info_comes_from_the_catalog_and_nvml_calls() -> None:
    fleet, _ = make("1x2xh200")
    info = fleet.node("sim-00").backend().device_info(1)
    assert info.name == "NVIDIA H200"
    assert info.model == "h200-sxm"
    assert info.pci_device_id == "0x233510DE"
    assert info.memory_total_bytes == 143771 * 2**20
    assert (info.power_limit_min_w, info.power_limit_max_w, info.power_limit_default_w) == (
        200,
        700,
        700,
    )
    assert (
        info.pcie_gen_current,
        info.pcie_gen_max,
        info.pcie_width_current,
        info.pcie_width_max,
    ) == (5, 5, 16, 16)
    assert info.persistence_mode is True and info.ecc_current is True and info.mig_current is False
    assert info.driver_version == "580.159.04" and info.nvml_version == "13.580.159.04"
    assert info.cuda_driver_version == "13.0"
    assert info.uuid.startswith("GPU-") and len(info.uuid) == 40


def test_identities_are_deterministic_per_seed() -> None:
    a, _ = make(seed=1)
    b, _ = make(seed=1)
    c, _ = make(seed=2)

    def uuids(f: SimFleet) -> list[str]:
        return [f.node("sim-00").backend().device_info(i).uuid for i in range(4)]

    assert uuids(a) == uuids(b)
    assert uuids(a) != uuids(c)
    assert len(set(uuids(a))) == 4


def test_not_supported_becomes_none() -> None:
    fleet, _ = make()
    s = fleet.node("sim-00").backend().sample_slow(0)
    # Hopper retired pages answer NotSupported (probe): None, not 0
    assert (
        s.retired_pages_sbe is None
        and s.retired_pages_dbe is None
        and s.retired_pages_pending is None
    )
    assert s.energy_mj is not None and s.energy_mj > 0


def test_function_not_found_is_recorded_once_and_falls_back() -> None:
    fleet, _ = make()
    node = fleet.node("sim-00")
    lib = SimNvml(node, missing_functions=("nvmlDeviceGetCurrentClocksEventReasons",))
    backend = NvmlBackend(lib=lib, node_name=node.name, clock=node.clock)
    s1 = backend.sample_fast(0)
    s2 = backend.sample_fast(1)
    # falls back to the older throttle-reasons call, which answers the same mask
    assert s1.clock_event_reasons == int(ClockEventReason.GPU_IDLE)
    assert s2.clock_event_reasons == int(ClockEventReason.GPU_IDLE)
    problems = backend.problems()
    assert len([p for p in problems if "nvmlDeviceGetCurrentClocksEventReasons" in p]) == 1


def test_lost_gpu_fails_alone_and_is_reported_once() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.FALLEN_OFF_BUS, node="sim-00", gpu=2, at_s=5))
    backend = fleet.node("sim-00").backend()
    assert backend.sample(2).power_w is not None  # fine before the fault
    clock.advance(6)
    with pytest.raises(GpuLostError):
        backend.sample_fast(2)
    with pytest.raises(GpuLostError):  # every later call too
        backend.device_info(2)
    for i in (0, 1, 3):
        assert backend.sample(i).gpu_temp_c is not None
    assert backend.lost_gpus() == frozenset({2})
    events = backend.poll_events()
    assert [e.kind for e in events].count("gpu_lost") == 1
    assert backend.poll_events() == [] or all(e.kind != "gpu_lost" for e in backend.poll_events())


def test_xid_events_arrive_through_the_event_set_once() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.XID, node="sim-00", gpu=1, at_s=2, params={"xid": 13}))
    fleet.inject(Fault(FaultKind.ECC_DBE, node="sim-00", gpu=3, at_s=4))
    backend = fleet.node("sim-00").backend()
    assert backend.poll_events() == []
    clock.advance(3)
    ev = backend.poll_events()
    assert [(e.gpu_index, e.xid) for e in ev] == [(1, 13)]
    clock.advance(2)
    ev = backend.poll_events()
    assert [(e.gpu_index, e.xid) for e in ev] == [(3, 48)]
    assert backend.poll_events() == []
    s = backend.sample(3)
    assert s.ecc_dbe_volatile == 1 and s.ecc_dbe_aggregate == 1


def test_row_remap_pending_and_failure() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.ROW_REMAP_PENDING, node="sim-00", gpu=0))
    fleet.inject(Fault(FaultKind.ROW_REMAP_FAILURE, node="sim-00", gpu=1, at_s=1))
    backend = fleet.node("sim-00").backend()
    clock.advance(2)
    s0, s1, s2 = backend.sample_fast(0), backend.sample_fast(1), backend.sample_fast(2)
    assert s0.remap_pending is True and s0.remap_failure is False
    assert s1.remap_failure is True
    assert s2.remap_pending is False and s2.remap_failure is False


def test_pcie_downgrade_and_replays() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.PCIE_DOWNGRADE, node="sim-00", gpu=1, params={"gen": 4}))
    fleet.inject(Fault(FaultKind.PCIE_DOWNGRADE, node="sim-00", gpu=2, params={"width": 8}))
    fleet.inject(Fault(FaultKind.PCIE_REPLAYS, node="sim-00", gpu=3, params={"rate_per_min": 120}))
    backend = fleet.node("sim-00").backend()
    clock.advance(60)
    i1, i2 = backend.device_info(1), backend.device_info(2)
    assert (i1.pcie_gen_current, i1.pcie_gen_max, i1.pcie_width_current) == (4, 5, 16)
    assert (i2.pcie_gen_current, i2.pcie_width_current, i2.pcie_width_max) == (5, 8, 16)
    assert backend.sample_slow(3).pcie_replay_count == 120
    assert backend.sample_slow(0).pcie_replay_count == 0


def test_thermal_slowdown_and_power_brake_set_their_reasons() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.THERMAL_SLOWDOWN, node="sim-00", gpu=0))
    fleet.inject(Fault(FaultKind.HW_POWER_BRAKE, node="sim-00", gpu=1))
    from gpufleet.devices.sim import Load

    for g in fleet.node("sim-00").gpus:
        g.run(Load())
    clock.advance(5)
    backend = fleet.node("sim-00").backend()
    s0, s1, s2 = (backend.sample_fast(i) for i in range(3))
    assert (s0.clock_event_reasons or 0) & ClockEventReason.HW_THERMAL_SLOWDOWN
    assert s0.gpu_temp_c is not None and s0.gpu_temp_c >= 87
    assert (s1.clock_event_reasons or 0) & ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    assert s1.sm_clock_mhz is not None and s1.sm_clock_mhz <= 0.3 * 1980 + 15
    assert not (s2.clock_event_reasons or 0) & (
        ClockEventReason.HW_THERMAL_SLOWDOWN | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    )
    assert backend.sample_slow(0).thermal_violation_us is not None
    assert (backend.sample_slow(0).thermal_violation_us or 0) > 0


def test_sbe_rate_persistence_and_ecc_faults() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.ECC_SBE, node="sim-00", gpu=0, params={"count": 7}))
    fleet.inject(Fault(FaultKind.PERSISTENCE_OFF, node="sim-00", gpu=1))
    fleet.inject(Fault(FaultKind.ECC_DISABLED, node="sim-00", gpu=2))
    backend = fleet.node("sim-00").backend()
    clock.advance(1)
    assert backend.sample_fast(0).ecc_sbe_volatile == 7
    assert backend.device_info(1).persistence_mode is False
    info2 = backend.device_info(2)
    assert info2.ecc_current is False
    assert backend.sample_fast(2).ecc_sbe_volatile is None  # counters unsupported with ECC off


def test_hung_call_blocks_only_until_released() -> None:
    fleet, _ = make()
    fleet.inject(Fault(FaultKind.HUNG_CALL, node="sim-00", gpu=0, params={"seconds": 30}))
    node = fleet.node("sim-00")
    backend = node.backend()
    done = threading.Event()

    def worker() -> None:
        backend.sample_fast(0)
        done.set()

    t = threading.Thread(target=worker, daemon=True)
    start = time.monotonic()
    t.start()
    assert not done.wait(0.3)  # it hangs
    node.gpus[0].hang_release.set()
    assert done.wait(5)
    assert time.monotonic() - start < 10


def test_no_driver_is_a_clear_no_device_error() -> None:
    class NoDriver:
        NVMLError = __import__("pynvml").NVMLError

        def nvmlInit(self) -> None:
            raise self.NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    backend = NvmlBackend(lib=NoDriver(), node_name="x")
    with pytest.raises(NoDeviceError, match="NVML could not initialise"):
        backend.device_count()


def test_close_shuts_nvml_down() -> None:
    fleet, _ = make()
    node = fleet.node("sim-00")
    backend = node.backend()
    backend.device_count()
    assert node.nvml._init_count == 1
    backend.close()
    assert node.nvml._init_count == 0


def test_xid_79_of_a_lost_gpu_is_delivered() -> None:
    fleet, clock = make()
    fleet.inject(Fault(FaultKind.FALLEN_OFF_BUS, node="sim-00", gpu=1, at_s=2))
    backend = fleet.node("sim-00").backend()
    uuid1 = backend.device_info(1).uuid
    backend.poll_events()  # registers the event set while the GPU answers
    clock.advance(3)
    with pytest.raises(GpuLostError):
        backend.sample_fast(1)
    events = backend.poll_events()
    xids = [(e.gpu_index, e.xid, e.gpu_uuid) for e in events if e.kind == "xid"]
    assert xids == [(1, 79, uuid1)]
    assert [e.gpu_index for e in events if e.kind == "gpu_lost"] == [1]


def test_gpm_ratios_over_an_interval_and_unsupported_models() -> None:
    from gpufleet.devices.sim import Load

    fleet, clock = make("1x2xh200")
    node = fleet.node("sim-00")
    backend = node.backend()
    assert backend.sample_gpm(0) is None  # GPM needs two samples
    node.gpus[0].run(Load(util=0.5, pcie_tx_bytes_per_s=8e6), duration_s=1.0)
    clock.advance(2.0)  # half of the interval at 50 % util -> 25 % graphics activity
    prof = backend.sample_gpm(0)
    assert prof is not None
    assert prof["prof_gr_engine_active"] == pytest.approx(0.25, abs=0.01)
    assert prof["prof_pcie_tx_bytes"] == pytest.approx(4e6, rel=0.02)
    ampere, _ = make("1x1xa100-sxm4-80gb")
    b2 = ampere.node("sim-00").backend()
    assert b2.sample_gpm(0) is None and b2.sample_gpm(0) is None


def test_running_processes_lists_the_loads_pid_and_memory() -> None:
    from gpufleet.devices.sim import Load

    fleet, clock = make("1x2xh100")
    node = fleet.node("sim-00")
    node.gpus[1].run(Load(fb_used_bytes=3 * 2**30))
    clock.advance(1)
    backend = node.backend()
    assert backend.running_processes(0) == []
    assert backend.running_processes(1) == [(10_001, 3 * 2**30)]  # the simulator's pid 10000+i


def test_field_values_read_through_the_raw_layout_as_pynvml_reads_them() -> None:
    """`field_values` reads an array of ``c_nvmlFieldValue_t`` through `RawFieldValue` (its
    bytes without pynvml's attribute hooks): each value type, a failed entry, and a list that
    is not a ctypes array give what the written values were."""
    from gpufleet.devices.nvml.fields import field_value, field_values

    written: list[tuple[int, int, str, float | int]] = [  # (return, valueType, member, value)
        (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 2.5),
        (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
        (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40 + 7),
        (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -12),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 9),
    ]
    arr = (pynvml.c_nvmlFieldValue_t * len(written))()
    for fv, (ret, vtype, member, value) in zip(arr, written, strict=True):
        fv.fieldId, fv.nvmlReturn, fv.valueType = 155, ret, vtype
        setattr(fv.value, member, value)
    expected = [2.5, 4_000_000_000, 2**40 + 7, -12, None]
    assert field_values(arr) == expected
    assert [field_value(fv) for fv in arr] == expected
    assert field_values(list(arr)) == expected  # not an array: entry by entry
