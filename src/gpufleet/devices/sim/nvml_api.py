"""`SimNvml`: a drop-in for the ``pynvml`` module over one simulated node.

It exposes the same function names, arguments, return types and ``NVMLError_*`` classes as
nvidia-ml-py for every call gpufleet's NVML backend makes, so ``NvmlBackend(lib=SimNvml(node))``
runs the production code. Constants and error classes come from pynvml itself (a pure-Python
module that imports without a driver); unknown attributes fall through to it.

Which calls answer NotSupported follows the real H200 probe
(``tests/fixtures/nvidia-h200/nvml_probe.json``): retired pages (Hopper uses row remapping),
fan speed, NVLink counters without NVLink peers.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pynvml

from gpufleet.devices.nvml.fields import RawFieldValue
from gpufleet.devices.sim.faults import FaultKind
from gpufleet.devices.sim.nvml_clocks import SimClockCalls

if TYPE_CHECKING:
    from gpufleet.devices.sim.fleet import SimNode
    from gpufleet.devices.sim.gpu import SimGpu

_NS = pynvml.NVML_ERROR_NOT_SUPPORTED
_ARCH_IDS = {"ampere": 7, "hopper": 9, "blackwell": 10, "ada": 8}  # nvmlDeviceArchitecture_t


@dataclass(frozen=True)
class SimHandle:
    """What nvmlDeviceGetHandleByIndex returns: opaque to callers."""

    node: str
    index: int


class _LazyMetrics(dict[int, SimpleNamespace]):
    """The metrics array of a GPM request: entries made on first access (the real struct holds
    NVML_GPM_METRIC_MAX of them; a caller only touches the first ``numMetrics``)."""

    def __missing__(self, index: int) -> SimpleNamespace:
        if not 0 <= index < pynvml.NVML_GPM_METRIC_MAX:
            raise IndexError(index)
        entry = SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
        self[index] = entry
        return entry


@dataclass(frozen=True)
class SimMigHandle:
    """What nvmlDeviceGetMigDeviceHandleByIndex returns."""

    node: str
    index: int
    slot: int


class _EventSet:
    def __init__(self) -> None:
        self.handles: dict[int, tuple[SimHandle, int]] = {}
        self.delivered: set[tuple[int, float, int]] = set()


def _function_not_found(*_args: Any, **_kwargs: Any) -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimNvml(SimClockCalls):
    """The NVML API of one simulated node."""

    NVMLError = pynvml.NVMLError

    def __init__(self, node: SimNode, *, missing_functions: tuple[str, ...] = ()) -> None:
        self._node = node
        self._init_count = 0
        self._lock = threading.Lock()
        self._missing = set(missing_functions)
        self.calls = 0  # how many NVML calls were made (benchmarks, tests)
        self.set_limit_calls = 0  # nvmlDeviceSetPowerManagementLimit calls (tests)
        for name in self._missing:  # an older driver: the symbol is absent from libnvidia-ml
            setattr(self, name, _function_not_found)

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("_missing", ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return getattr(pynvml, name)

    # ----- plumbing ------------------------------------------------------------------------
    def _check_init(self) -> None:
        if self._init_count <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: SimHandle) -> SimGpu:
        self._check_init()
        self.calls += 1
        if not isinstance(handle, SimHandle) or handle.node != self._node.name:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._node.gpus[handle.index]
        gpu.advance(self._node.clock())
        if gpu.faults:
            if gpu.lost:
                raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
            hung = gpu.has_fault(FaultKind.HUNG_CALL)
            if hung is not None:
                gpu.hang_release.wait(float(hung.param("seconds", 5.0)))
        return gpu

    # ----- library and system --------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count <= 0:
                raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self._node.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init()
        if self._node.nvml_version is None:
            raise _err(_NS)  # a driver older than the catalog's CUDA table
        return self._node.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        if self._node.cuda_driver_version is None:
            raise _err(_NS)  # a driver older than the catalog's CUDA table
        return self._node.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimHandle:
        self._check_init()
        if not 0 <= index < len(self._node.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = SimHandle(self._node.name, index)
        self._gpu(handle)  # a lost GPU fails here too, as on real hardware
        return handle

    # ----- identity ------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: SimHandle | SimMigHandle) -> str:
        if isinstance(h, SimMigHandle):
            gpu, (_, profile, _) = self._mig(h)
            base = gpu.model.nvml_names[0] if gpu.model.nvml_names else gpu.model.marketing_name
            return f"{base} MIG {profile}"
        names = self._gpu(h).model.nvml_names
        return names[0] if names else self._gpu(h).model.marketing_name

    # ----- MIG devices -----------------------------------------------------------------------
    def _mig(self, mh: SimMigHandle) -> tuple[SimGpu, tuple[int, str, int]]:
        gpu = self._gpu(SimHandle(mh.node, mh.index))
        instances = gpu.mig_instances()
        if not 0 <= mh.slot < len(instances):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu, instances[mh.slot]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: SimHandle) -> int:
        gpu = self._gpu(h)
        if gpu.model.mig_max_instances == 0:
            raise _err(_NS)
        return gpu.model.mig_max_instances

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: SimHandle, index: int) -> SimMigHandle:
        gpu = self._gpu(h)
        if not gpu.mig_enabled:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(gpu.mig_instances()):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return SimMigHandle(h.node, h.index, index)

    def nvmlDeviceGetGpuInstanceId(self, mh: SimMigHandle) -> int:
        return self._mig(mh)[1][0]

    def nvmlDeviceGetComputeInstanceId(self, mh: SimMigHandle) -> int:
        self._mig(mh)
        return 0

    def nvmlGpmMigSampleGet(
        self, h: SimHandle, gpu_instance_id: int, sample: SimpleNamespace
    ) -> SimpleNamespace:
        gpu = self._gpu(h)
        if gpu_instance_id not in [gi for gi, _, _ in gpu.mig_instances()]:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        self.nvmlGpmSampleGet(h, sample)  # instances share the GPU's activity in the simulator
        sample.gpu = (h.node, h.index, gpu_instance_id)
        return sample

    def nvmlDeviceGetUUID(self, h: SimHandle) -> str:
        return self._gpu(h).uuid

    def nvmlDeviceGetSerial(self, h: SimHandle) -> str:
        return self._gpu(h).serial

    def nvmlDeviceGetVbiosVersion(self, h: SimHandle) -> str:
        return str(self._gpu(h).vbios_version)

    def nvmlDeviceGetInforomImageVersion(self, h: SimHandle) -> str:
        return self._gpu(h).inforom_version

    def nvmlDeviceGetMinorNumber(self, h: SimHandle) -> int:
        return self._gpu(h).index

    def nvmlDeviceGetArchitecture(self, h: SimHandle) -> int:
        return _ARCH_IDS.get(self._gpu(h).model.architecture, 0xFFFFFFFF)

    def nvmlDeviceGetCudaComputeCapability(self, h: SimHandle) -> tuple[int, int]:
        cc = self._gpu(h).model.compute_capability or "0.0"
        major, minor = cc.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetPciInfo(self, h: SimHandle) -> SimpleNamespace:
        gpu = self._gpu(h)
        ids = gpu.model.pci_device_ids
        dev_id = int(ids[0], 16) if ids else 0
        bus = int(gpu.pci_bus_id.split(":")[1], 16)
        return SimpleNamespace(
            busId=gpu.pci_bus_id,
            busIdLegacy=gpu.pci_bus_id[4:],
            domain=0,
            bus=bus,
            device=0,
            pciDeviceId=dev_id,
            pciSubSystemId=0x18BF10DE,
        )

    def nvmlDeviceGetPciInfo_v3(self, h: SimHandle) -> SimpleNamespace:
        return self.nvmlDeviceGetPciInfo(h)

    # ----- configuration -------------------------------------------------------------------
    def nvmlDeviceGetPersistenceMode(self, h: SimHandle) -> int:
        return 0 if self._gpu(h).has_fault(FaultKind.PERSISTENCE_OFF) else 1

    def nvmlDeviceGetEccMode(self, h: SimHandle) -> list[int]:
        off = self._gpu(h).has_fault(FaultKind.ECC_DISABLED)
        return [0, 0] if off else [1, 1]

    def nvmlDeviceGetMigMode(self, h: SimHandle) -> list[int]:
        gpu = self._gpu(h)
        if gpu.model.mig_max_instances == 0:
            raise _err(_NS)
        return [int(gpu.mig_enabled), int(gpu.mig_enabled)]

    def nvmlDeviceGetComputeMode(self, h: SimHandle) -> int:
        self._gpu(h)
        return int(pynvml.NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: SimHandle) -> list[int]:
        m = self._gpu(h).model
        lo = m.power_limit_min_w if m.power_limit_min_w is not None else 0.5 * m.max_power_w
        hi = m.power_limit_max_w if m.power_limit_max_w is not None else m.max_power_w
        return [int(lo * 1000), int(hi * 1000)]

    def nvmlDeviceSetPowerManagementLimit(self, h: SimHandle, limit_mw: int) -> None:
        """As the driver: NoPermission without root (``SimNode.power_admin``), InvalidArgument
        outside the constraints (checked first, as nvidia-smi -pl reports a bad value first)."""
        gpu = self._gpu(h)
        self.set_limit_calls += 1
        lo, hi = self.nvmlDeviceGetPowerManagementLimitConstraints(h)
        if not lo <= int(limit_mw) <= hi:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not self._node.power_admin:
            raise _err(pynvml.NVML_ERROR_NO_PERMISSION)
        with gpu.lock:
            gpu.power_limit_w = int(limit_mw) / 1000.0

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: SimHandle) -> int:
        return int(self._gpu(h).model.max_power_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, h: SimHandle) -> int:
        return int(float(self._gpu(h).power_limit_w or 0) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: SimHandle) -> int:
        return self.nvmlDeviceGetPowerManagementLimit(h)

    def nvmlDeviceGetMaxClockInfo(self, h: SimHandle, clock_type: int) -> int:
        m = self._gpu(h).model
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return int(m.max_sm_clock_mhz or 1980)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return int(m.max_mem_clock_mhz or 2619)
        raise _err(_NS)

    def nvmlDeviceGetTemperatureThreshold(self, h: SimHandle, threshold: int) -> int:
        m = self._gpu(h).model
        table = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: m.shutdown_temp_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: m.slowdown_temp_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: m.max_operating_temp_c,
        }
        value = table.get(threshold)
        if value is None:
            raise _err(_NS)
        return int(value)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: SimHandle) -> int:
        return self._gpu(h).pcie_link()[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: SimHandle) -> int:
        return self._gpu(h).pcie_link()[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: SimHandle) -> int:
        return self._gpu(h).model.pcie_generation

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: SimHandle) -> int:
        return self._gpu(h).model.pcie_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: SimHandle) -> int:
        return self._gpu(h).model.pcie_lanes

    # ----- readings ------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: SimHandle) -> SimpleNamespace:
        gpu_util, mem_util = self._gpu(h).util_reading()
        return SimpleNamespace(gpu=gpu_util, memory=mem_util)

    def nvmlDeviceGetEncoderUtilization(self, h: SimHandle) -> list[int]:
        self._gpu(h)
        return [0, 100000]

    def nvmlDeviceGetDecoderUtilization(self, h: SimHandle) -> list[int]:
        self._gpu(h)
        return [0, 100000]

    def nvmlDeviceGetMemoryInfo(
        self, h: SimHandle | SimMigHandle, version: int | None = None
    ) -> SimpleNamespace:
        if isinstance(h, SimMigHandle):
            gpu, (_, _, mib) = self._mig(h)
            total = mib * 2**20
            share = total / gpu.model.memory_bytes
            reserved = 0
            used = min(int(gpu.fb_used_bytes() * share), total)
        else:
            gpu = self._gpu(h)
            total = gpu.model.memory_bytes
            reserved = min(total // 50, 512 * 2**20)
            used = min(gpu.fb_used_bytes(), total - reserved)
        info = SimpleNamespace(total=total, used=used, free=total - used - reserved)
        if version is not None:
            info.reserved = reserved
            info.version = version
        else:  # v1 folds the reservation into "used", as the real call does
            info.used = used + reserved
        return info

    def nvmlDeviceGetTemperature(self, h: SimHandle, sensor: int) -> int:
        gpu = self._gpu(h)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(gpu.temp_c)

    def nvmlDeviceGetTemperatureV(
        self, h: SimHandle, sensor: int, version: int = pynvml.nvmlTemperature_v1
    ) -> int:
        """The successor of nvmlDeviceGetTemperature (same reading, versioned struct)."""
        return self.nvmlDeviceGetTemperature(h, sensor)

    def nvmlDeviceGetPowerUsage(self, h: SimHandle) -> int:
        return round(self._gpu(h).state.power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: SimHandle) -> int:
        return self._gpu(h).energy_counter_mj()

    def nvmlDeviceGetClockInfo(self, h: SimHandle, clock_type: int) -> int:
        gpu = self._gpu(h)
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return gpu.sm_clock_reading()
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return int(gpu.model.max_mem_clock_mhz or 2619)
        raise _err(_NS)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimHandle) -> int:
        return self._gpu(h).state.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: SimHandle) -> int:
        return self._gpu(h).state.reasons  # the pre-12.x name of the same call

    def nvmlDeviceGetRemappedRows(self, h: SimHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu(h)
        pending = gpu.has_fault(FaultKind.ROW_REMAP_PENDING) is not None
        failure = gpu.has_fault(FaultKind.ROW_REMAP_FAILURE) is not None
        return (gpu.remapped_cor, gpu.remapped_unc, int(pending), int(failure))

    def nvmlDeviceGetRetiredPages(self, h: SimHandle, source_filter: int) -> list[int]:
        gpu = self._gpu(h)
        f = gpu.has_fault(FaultKind.RETIRED_PAGES)
        if f is None:
            raise _err(_NS)  # Hopper: retirement replaced by row remapping (probe)
        key = (
            "dbe"
            if source_filter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            else "sbe"
        )
        return [0x1000 * (i + 1) for i in range(int(f.param(key, 0)))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: SimHandle) -> int:
        if self._gpu(h).has_fault(FaultKind.RETIRED_PAGES) is None:
            raise _err(_NS)
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h: SimHandle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(h)
        if gpu.has_fault(FaultKind.ECC_DISABLED):
            raise _err(_NS)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return gpu.ecc_sbe_volatile if corrected else gpu.ecc_dbe_volatile
        return gpu.ecc_sbe_aggregate if corrected else gpu.ecc_dbe_aggregate

    def nvmlDeviceGetPcieReplayCounter(self, h: SimHandle) -> int:
        return int(self._gpu(h).pcie_replays)

    def nvmlDeviceGetPcieThroughput(self, h: SimHandle, counter: int) -> int:
        gpu = self._gpu(h)
        load = gpu.load_at(gpu.t)
        if load is None:
            return 0
        rate = (
            load.pcie_tx_bytes_per_s
            if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES
            else load.pcie_rx_bytes_per_s
        )
        return int(rate / 1024)  # KB/s

    def nvmlDeviceGetViolationStatus(self, h: SimHandle, policy: int) -> SimpleNamespace:
        gpu = self._gpu(h)
        if policy == pynvml.NVML_PERF_POLICY_POWER:
            us = gpu.power_violation_us
        elif policy == pynvml.NVML_PERF_POLICY_THERMAL:
            us = gpu.thermal_violation_us
        else:
            us = 0.0
        return SimpleNamespace(referenceTime=int(gpu.t * 1e6), violationTime=int(us * 1000))

    def nvmlDeviceGetComputeRunningProcesses(self, h: SimHandle) -> list[SimpleNamespace]:
        gpu = self._gpu(h)
        load = gpu.load_at(gpu.t)
        if load is None:
            return []
        return [SimpleNamespace(pid=10_000 + gpu.index, usedGpuMemory=load.fb_used_bytes)]

    def nvmlDeviceGetFanSpeed(self, h: SimHandle) -> int:
        self._gpu(h)
        raise _err(_NS)  # passively cooled SXM boards (probe: NotSupported)

    # ----- batched field values ------------------------------------------------------------
    def _field_table(self, gpu: SimGpu) -> dict[int, tuple[int, float | int] | None]:
        """(valueType, value) of every field id the simulated GPU answers; None: NotSupported."""
        u32 = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        ull, sll, dbl = (
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG,
            pynvml.NVML_VALUE_TYPE_DOUBLE,
        )
        ecc_off = gpu.has_fault(FaultKind.ECC_DISABLED) is not None
        has_nvlink = gpu.nvlink_count > 0 and len(self._node.gpus) > 1
        pending = gpu.has_fault(FaultKind.ROW_REMAP_PENDING) is not None
        failure = gpu.has_fault(FaultKind.ROW_REMAP_FAILURE) is not None
        table: dict[int, tuple[int, float | int] | None] = {
            pynvml.NVML_FI_DEV_ECC_CURRENT: (ull, 0 if ecc_off else 1),
            pynvml.NVML_FI_DEV_ECC_PENDING: (ull, 0 if ecc_off else 1),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: None if ecc_off else (ull, gpu.ecc_sbe_volatile),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: None if ecc_off else (ull, gpu.ecc_dbe_volatile),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: None if ecc_off else (ull, gpu.ecc_sbe_aggregate),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: None if ecc_off else (ull, gpu.ecc_dbe_aggregate),
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (ull, round(gpu.state.mem_temp_c)),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ull, gpu.energy_counter_mj()),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, int(gpu.pcie_replays)),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (ull, gpu.remapped_cor),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (ull, gpu.remapped_unc),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (ull, int(pending)),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (ull, int(failure)),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (ull, round(gpu.state.power_w * 1000)),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (ull, round(gpu.state.power_w * 1000)),
            pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: (
                ull,
                int(float(gpu.power_limit_w or 0) * 1000),
            ),
            # 32-bit counters that wrap, as on the H200 (nvml_probe.json: valueType 1)
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (u32, int(gpu.pcie_tx_total) & 0xFFFFFFFF),
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (u32, int(gpu.pcie_rx_total) & 0xFFFFFFFF),
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER: (ull, int(gpu.power_violation_us * 1000)),
            pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: (ull, int(gpu.thermal_violation_us * 1000)),
        }
        if has_nvlink:
            # Totals over every link. The simulated CRC errors are flow-control (flit) CRC
            # errors; data CRC errors stay 0.
            table.update(
                {
                    pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (u32, gpu.nvlink_count),
                    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (
                        ull,
                        sum(int(x) for x in gpu.nvlink_crc),
                    ),
                    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: (ull, 0),
                    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (
                        ull,
                        sum(int(x) for x in gpu.nvlink_replay),
                    ),
                    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (
                        ull,
                        sum(gpu.nvlink_recovery),
                    ),
                }
            )
        else:
            for fid in (
                pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
                pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
            ):
                table[fid] = None
        _ = (sll, dbl)
        return table

    def _link_table(self, gpu: SimGpu, link: int) -> dict[int, tuple[int, float | int]]:
        """(valueType, value) of every field scoped to one NVLink (``scopeId`` = link), as
        NVML answers them; empty for a link the GPU does not have."""
        if gpu.nvlink_count == 0 or len(self._node.gpus) < 2 or not 0 <= link < gpu.nvlink_count:
            return {}
        u32 = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        return {
            pynvml.NVML_FI_DEV_NVLINK_GET_STATE: (u32, 0 if gpu.nvlink_down(link) else 1),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: (ull, int(gpu.nvlink_crc[link])),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: (ull, int(gpu.nvlink_replay[link])),
            pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: (ull, gpu.nvlink_recovery[link]),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (ull, int(gpu.nvlink_tx_kib[link])),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (ull, int(gpu.nvlink_rx_kib[link])),
        }

    def nvmlDeviceGetFieldValues(self, h: SimHandle, field_ids: list[Any]) -> Any:
        """Like pynvml: an id, or ``(id, scopeId)`` for fields scoped to a link. The agent asks
        for 18 links x 6 fields of every GPU each slow sample: each link's table is built once
        a call, and the values are written through `RawFieldValue` (plain ctypes members, not
        pynvml's Python attribute hooks) into the array pynvml's type reads."""
        gpu = self._gpu(h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        raw = (RawFieldValue * len(field_ids)).from_buffer(values)  # the same bytes
        now_us = int(gpu.t * 1e6)
        table = self._field_table(gpu)
        links: dict[int, dict[int, tuple[int, float | int]]] = {}
        ns_type = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        for i, item in enumerate(field_ids):
            v = raw[i]
            if isinstance(item, tuple):
                fid, scope = int(item[0]), int(item[1])
                per_link = links.get(scope)
                if per_link is None:
                    per_link = links[scope] = self._link_table(gpu, scope)
                entry = per_link.get(fid)
                v.scopeId = scope
            else:
                fid = int(item)
                entry = table.get(fid)
            value: float | int = 0
            if entry is None:
                ret, vtype = _NS, ns_type
            else:
                ret, (vtype, value) = pynvml.NVML_SUCCESS, entry
            v.fieldId = fid
            v.timestamp = now_us
            v.latencyUsec = 0
            v.nvmlReturn = ret
            v.valueType = vtype
            if vtype == pynvml.NVML_VALUE_TYPE_DOUBLE:
                v.value.dVal = float(value)
            elif vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                v.value.uiVal = int(value)
            else:
                v.value.ullVal = ctypes.c_ulonglong(int(value)).value
        return values

    # ----- GPM (profiling metrics, Hopper and newer) ------------------------------------------
    class c_nvmlGpmMetricsGet_t:  # pynvml's name
        """Python stand-in for pynvml's ctypes struct (samples here are Python objects)."""

        def __init__(self) -> None:
            self.version = 0
            self.numMetrics = 0
            self.sample1: Any = None
            self.sample2: Any = None
            self.metrics = _LazyMetrics()

    def nvmlGpmQueryDeviceSupport(self, h: SimHandle) -> SimpleNamespace:
        gpu = self._gpu(h)
        supported = gpu.model.architecture in ("hopper", "blackwell")
        return SimpleNamespace(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(supported)
        )

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self._check_init()
        return SimpleNamespace(gpu=None, t=0.0, counters=None)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self._check_init()
        sample.counters = None

    def nvmlGpmSampleGet(self, h: SimHandle, sample: SimpleNamespace) -> SimpleNamespace:
        gpu = self._gpu(h)
        if gpu.model.architecture not in ("hopper", "blackwell"):
            raise _err(_NS)
        sample.gpu = (h.node, h.index)
        sample.t = gpu.t
        sample.counters = (
            gpu.gr_busy_s,
            gpu.tensor_busy_s,
            gpu.dram_busy_s,
            gpu.pcie_tx_total,
            gpu.pcie_rx_total,
        )
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._check_init()
        s1, s2 = mg.sample1, mg.sample2
        if (
            s1 is None
            or s2 is None
            or s1.counters is None
            or s2.counters is None
            or s1.gpu != s2.gpu
        ):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dt = s2.t - s1.t
        d = [b - a for a, b in zip(s1.counters, s2.counters, strict=True)]

        def ratio(x: float) -> float:
            return 0.0 if dt <= 0 else max(0.0, min(1.0, x / dt))

        def per_s(x: float) -> float:
            return 0.0 if dt <= 0 else max(0.0, x / dt)

        values = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 100.0 * ratio(d[0]),
            pynvml.NVML_GPM_METRIC_SM_UTIL: 96.6 * ratio(d[0]),  # probe: 96.4 SM at 99.8 graphics
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 100.0 * ratio(d[1]),
            pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 100.0 * ratio(d[1]),
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 100.0 * ratio(d[2]),
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: per_s(d[3]) / 2**20,  # MiB/s
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: per_s(d[4]) / 2**20,
        }
        for i in range(int(mg.numMetrics)):
            m = mg.metrics[i]
            if int(m.metricId) in values:
                m.value = values[int(m.metricId)]
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = _NS
        return mg

    # ----- events --------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, h: SimHandle) -> int:
        self._gpu(h)
        return 65439  # what the H200 reports (probe "events.supported")

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check_init()
        return _EventSet()

    def nvmlDeviceRegisterEvents(
        self, h: SimHandle, event_types: int, event_set: _EventSet
    ) -> None:
        self._gpu(h)
        event_set.handles[h.index] = (h, int(event_types))

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._check_init()
        now = self._node.clock()
        for idx, (handle, types) in sorted(event_set.handles.items()):
            if not types & pynvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = self._node.gpus[idx]
            gpu.advance(now)
            for when, xid in list(gpu.pending_events):
                key = (idx, when, xid)
                if key in event_set.delivered or when > now:
                    continue
                event_set.delivered.add(key)
                return SimpleNamespace(
                    device=handle,
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                    timeStamp=int(when * 1e6),
                )
        raise _err(pynvml.NVML_ERROR_TIMEOUT)  # nothing pending (no real wait in simulation)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check_init()
        event_set.handles.clear()
