"""`NvmlBackend`: every NVML call gpufleet makes goes through one query helper here.

The library is a parameter: ``NvmlBackend(lib=pynvml)`` on real GPUs,
``NvmlBackend(lib=SimNvml(...))`` in tests and demos, so the production code path is what every
test runs. The helper initialises NVML lazily under a lock, turns NotSupported into None,
records FunctionNotFound and permission problems once (``problems()``, shown by
``gpufleet doctor``), and marks a GPU that answers GpuIsLost as lost without stopping the others.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpufleet.catalog import load_catalog
from gpufleet.devices.backend import register_backend
from gpufleet.devices.nvml import fields as F
from gpufleet.devices.nvml.clocks import ClockControl
from gpufleet.devices.nvml.errors import NvmlSeverity, error_name, mismatch_error, severity_of
from gpufleet.devices.nvml.gpm import GpmReadings
from gpufleet.devices.types import DeviceInfo, GpuEvent, NvLinkCounters, Sample
from gpufleet.errors import DeviceError, GpuLostError, NoDeviceError

log = logging.getLogger(__name__)
_MEM_V2 = "nvmlDeviceGetMemoryInfo_v2"

_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def load_pynvml() -> Any:
    """Import nvidia-ml-py (no driver needed to import; nvmlInit finds the driver)."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise NoDeviceError(
            "nvidia-ml-py is not installed", hint="pip install nvidia-ml-py"
        ) from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@register_backend("nvml")
class NvmlBackend(GpmReadings, ClockControl):
    """The GPUs of one node through NVML (real or simulated)."""

    def __init__(
        self,
        lib: Any = None,
        *,
        node_name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lib = lib if lib is not None else load_pynvml()
        self.node_name = node_name or _hostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._initialised = False
        self._handles: dict[int, Any] = {}
        self._lost: set[int] = set()
        self._lost_reported: set[int] = set()
        self._missing: set[str] = set()
        self._problems: dict[str, str] = {}
        self._event_set: Any = None
        self._uuid_to_index: dict[str, int] = {}
        self._gpm_supported: dict[int, bool] = {}
        self._gpm_prev: dict[int, Any] = {}
        self.nvml_calls = 0

    # ----- the one query helper ------------------------------------------------------------
    def _ensure_init(self) -> None:
        if self._initialised:
            return
        with self._lock:
            if self._initialised:
                return
            try:
                self._lib.nvmlInit()
            except self._lib.NVMLError as exc:
                raise NoDeviceError(
                    f"NVML could not initialise: {exc} ({error_name(exc.value)})",
                    hint="is the NVIDIA driver loaded? try `gpufleet doctor`, or --sim 1x8xh100",
                ) from exc
            self._initialised = True

    def _record(self, key: str, message: str) -> None:
        self._problems.setdefault(key, message)

    def call(self, fn: str, *args: Any, gpu: int | None = None, variant: str | None = None) -> Any:
        """Call ``lib.<fn>(*args)``; None for NotSupported/NoPermission/FunctionNotFound.

        ``variant`` names the C symbol a call resolves to when it is not ``fn`` itself
        (``nvmlDeviceGetMemoryInfo(h, nvmlMemory_v2)`` calls ``nvmlDeviceGetMemoryInfo_v2``):
        a missing symbol then disables that variant only, not the function's other forms.
        ``NVMLLibraryMismatchError`` (pynvml's "unversioned function called" wrapper around
        FunctionNotFound, not an ``NVMLError``) counts as FunctionNotFound.
        """
        self._ensure_init()
        key = variant or fn
        if key in self._missing:
            return None
        if gpu is not None and gpu in self._lost:
            raise GpuLostError(
                f"GPU {gpu} on {self.node_name} is lost (fell off the bus: NVML_ERROR_GPU_IS_LOST)"
            )
        try:
            func = getattr(self._lib, fn)
        except AttributeError:
            self._missing.add(key)
            self._record(key, f"{key}: not in this nvidia-ml-py version")
            return None
        self.nvml_calls += 1
        try:
            return func(*args)
        except mismatch_error(self._lib) as exc:
            self._function_not_found(key, f"{key}: {exc}")
            return None
        except self._lib.NVMLError as exc:
            code = int(exc.value)
            sev = severity_of(code)
            if sev is NvmlSeverity.IGNORE:
                return None
            if code == self._lib.NVML_ERROR_FUNCTION_NOT_FOUND:
                self._function_not_found(
                    key, f"{key}: function not found in the NVML library (driver too old?)"
                )
                return None
            if sev is NvmlSeverity.WARN:
                self._record(f"{fn}:{code}", f"{fn}: {exc} ({error_name(code)})")
                return None
            if sev is NvmlSeverity.CRITICAL and gpu is not None:
                self._lost.add(gpu)
                raise GpuLostError(
                    f"GPU {gpu} on {self.node_name}: {exc} ({error_name(code)})"
                ) from exc
            raise DeviceError(
                f"{fn} failed on {self.node_name}: {exc} ({error_name(code)})"
            ) from exc

    def _function_not_found(self, key: str, message: str) -> None:
        if key not in self._missing:
            log.warning("NVML on %s: %s", self.node_name, message)
        self._missing.add(key)
        self._record(key, message)

    def missing(self, symbol: str) -> bool:
        """Whether a call (or call variant) was found missing from the NVML library."""
        return symbol in self._missing

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            if h is None:
                raise DeviceError(f"no handle for GPU {index} on {self.node_name}")
            self._handles[index] = h
        return h

    def _event_gpu(self, handle: Any) -> tuple[int, str | None]:
        """Which GPU an event came from: by handle identity first (works for a lost GPU, whose
        every call fails), then by UUID."""
        key = _handle_key(handle)
        for i, h in self._handles.items():
            if _handle_key(h) == key:
                uuid = next((u for u, j in self._uuid_to_index.items() if j == i), None)
                return i, uuid
        try:
            uuid = self.call("nvmlDeviceGetUUID", handle)
        except (GpuLostError, DeviceError):
            return -1, None
        uuid_text = None if uuid is None else _text(uuid)
        if uuid_text is None:
            return -1, None
        if uuid_text in self._uuid_to_index:
            return self._uuid_to_index[uuid_text], uuid_text
        for i in range(self.device_count()):
            if i in self._lost:
                continue
            try:
                if _text(self._dev("nvmlDeviceGetUUID", i)) == uuid_text:
                    self._uuid_to_index[uuid_text] = i
                    return i, uuid_text
            except (GpuLostError, DeviceError):
                continue
        return -1, uuid_text

    def _dev(self, fn: str, index: int, *args: Any, variant: str | None = None) -> Any:
        return self.call(fn, self._handle(index), *args, gpu=index, variant=variant)

    def _dev_successor(self, new: str, old: str, index: int, *args: Any) -> Any:
        """``new`` (the successor of a deprecated getter), else ``old`` once ``new`` is known
        missing (an older driver or nvidia-ml-py)."""
        value = self._dev(new, index, *args)
        if value is None and self.missing(new):
            value = self._dev(old, index, *args)
        return value

    # ----- protocol ------------------------------------------------------------------------
    def device_count(self) -> int:
        n = self.call("nvmlDeviceGetCount")
        return int(n or 0)

    def lost_gpus(self) -> frozenset[int]:
        return frozenset(self._lost)

    def problems(self) -> list[str]:
        return list(self._problems.values())

    def system_versions(self) -> dict[str, str | None]:
        driver = self.call("nvmlSystemGetDriverVersion")
        nvml = self.call("nvmlSystemGetNVMLVersion")
        cuda = self.call("nvmlSystemGetCudaDriverVersion")
        cuda_text = None if cuda is None else f"{int(cuda) // 1000}.{(int(cuda) % 1000) // 10}"
        return {
            "driver_version": None if driver is None else _text(driver),
            "nvml_version": None if nvml is None else _text(nvml),
            "cuda_driver_version": cuda_text,
        }

    def device_info(self, index: int) -> DeviceInfo:
        lib = self._lib
        versions = self.system_versions()
        name = _text(self._dev("nvmlDeviceGetName", index) or "unknown")
        uuid = _text(self._dev("nvmlDeviceGetUUID", index) or f"unknown-{index}")
        self._uuid_to_index[uuid] = index
        pci = self._dev("nvmlDeviceGetPciInfo", index)
        pci_bus = _text(pci.busId) if pci is not None else None
        pci_dev = f"0x{int(pci.pciDeviceId) & 0xFFFFFFFF:08X}" if pci is not None else None
        model = load_catalog().gpu_by_nvml_name(name, pci_dev)
        limits = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", index)
        default_limit = self._dev("nvmlDeviceGetPowerManagementDefaultLimit", index)
        enforced = self._dev("nvmlDeviceGetEnforcedPowerLimit", index)
        ecc = self._dev("nvmlDeviceGetEccMode", index)
        mig = self._dev("nvmlDeviceGetMigMode", index)
        persistence = self._dev("nvmlDeviceGetPersistenceMode", index)
        compute = self._dev("nvmlDeviceGetComputeMode", index)

        def mw(v: Any) -> float | None:
            return None if v is None else float(v) / 1000.0

        return DeviceInfo(
            index=index,
            uuid=uuid,
            name=name,
            model=model.key if model else None,
            pci_bus_id=pci_bus,
            pci_device_id=pci_dev,
            serial=_opt_text(self._dev("nvmlDeviceGetSerial", index)),
            vbios_version=_opt_text(self._dev("nvmlDeviceGetVbiosVersion", index)),
            inforom_version=_opt_text(self._dev("nvmlDeviceGetInforomImageVersion", index)),
            driver_version=versions["driver_version"],
            cuda_driver_version=versions["cuda_driver_version"],
            nvml_version=versions["nvml_version"],
            memory_total_bytes=_mem_total(self._dev("nvmlDeviceGetMemoryInfo", index)),
            power_limit_default_w=mw(default_limit),
            power_limit_min_w=mw(limits[0]) if limits else None,
            power_limit_max_w=mw(limits[1]) if limits else None,
            power_limit_enforced_w=mw(enforced),
            max_sm_clock_mhz=_opt_int(
                self._dev("nvmlDeviceGetMaxClockInfo", index, lib.NVML_CLOCK_SM)
            ),
            max_mem_clock_mhz=_opt_int(
                self._dev("nvmlDeviceGetMaxClockInfo", index, lib.NVML_CLOCK_MEM)
            ),
            pcie_gen_current=_opt_int(self._dev("nvmlDeviceGetCurrPcieLinkGeneration", index)),
            pcie_gen_max=_opt_int(
                self._dev("nvmlDeviceGetGpuMaxPcieLinkGeneration", index)
                or self._dev("nvmlDeviceGetMaxPcieLinkGeneration", index)
            ),
            pcie_width_current=_opt_int(self._dev("nvmlDeviceGetCurrPcieLinkWidth", index)),
            pcie_width_max=_opt_int(self._dev("nvmlDeviceGetMaxPcieLinkWidth", index)),
            persistence_mode=None if persistence is None else bool(persistence),
            ecc_current=None if ecc is None else bool(ecc[0]),
            ecc_pending=None if ecc is None else bool(ecc[1]),
            mig_current=None if mig is None else bool(mig[0]),
            mig_pending=None if mig is None else bool(mig[1]),
            compute_mode=None
            if compute is None
            else _COMPUTE_MODES.get(int(compute), str(compute)),
            slowdown_temp_c=_opt_int(
                self._dev(
                    "nvmlDeviceGetTemperatureThreshold",
                    index,
                    lib.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                )
            ),
            shutdown_temp_c=_opt_int(
                self._dev(
                    "nvmlDeviceGetTemperatureThreshold",
                    index,
                    lib.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                )
            ),
            minor_number=_opt_int(self._dev("nvmlDeviceGetMinorNumber", index)),
        )

    def _fields(
        self, index: int, table: dict[int, tuple[str, float]]
    ) -> dict[str, float | int | None]:
        ids = list(table)
        values = self._dev("nvmlDeviceGetFieldValues", index, ids)
        out: dict[str, float | int | None] = {}
        if values is None:
            return out
        for fid, v in zip(ids, F.field_values(values), strict=False):
            attr, scale = table[fid]
            if v is None:
                out[attr] = None
            elif attr in F.BOOL_FIELDS:
                out[attr] = int(bool(v))
            elif attr in F.INT_FIELDS or attr.startswith("_"):
                out[attr] = int(v)
            else:
                out[attr] = float(v) * scale
        return out

    def sample_fast(self, index: int) -> Sample:
        lib = self._lib
        now = self._clock()
        f = self._fields(index, F.FAST_FIELDS)
        util = self._dev("nvmlDeviceGetUtilizationRates", index)
        mem = self._mem_info(index)
        temp = self._dev_successor(
            "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", index, lib.NVML_TEMPERATURE_GPU
        )
        sm = self._dev("nvmlDeviceGetClockInfo", index, lib.NVML_CLOCK_SM)
        memclk = self._dev("nvmlDeviceGetClockInfo", index, lib.NVML_CLOCK_MEM)
        reasons = self._dev("nvmlDeviceGetCurrentClocksEventReasons", index)
        if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in self._missing:
            reasons = self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", index)
        power = f.get("power_w")  # the 1 s average, as DCGM_FI_DEV_POWER_USAGE
        if power is None:  # nvmlDeviceGetPowerUsage: the 1 s average on Ampere and newer
            usage = self._dev("nvmlDeviceGetPowerUsage", index)
            power = None if usage is None else float(usage) / 1000.0
        return Sample(
            timestamp_s=now,
            gpu_util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_bytes=mem[0],
            mem_free_bytes=mem[1],
            mem_reserved_bytes=mem[2],
            gpu_temp_c=None if temp is None else float(temp),
            mem_temp_c=_opt_float(f.get("mem_temp_c")),
            power_w=None if power is None else float(power),
            power_instant_w=_opt_float(f.get("power_instant_w")),
            sm_clock_mhz=_opt_int(sm),
            mem_clock_mhz=_opt_int(memclk),
            clock_event_reasons=_opt_int(reasons),
            ecc_sbe_volatile=_opt_int(f.get("ecc_sbe_volatile")),
            ecc_dbe_volatile=_opt_int(f.get("ecc_dbe_volatile")),
            remapped_rows_correctable=_opt_int(f.get("remapped_rows_correctable")),
            remapped_rows_uncorrectable=_opt_int(f.get("remapped_rows_uncorrectable")),
            remap_pending=_opt_bool(f.get("remap_pending")),
            remap_failure=_opt_bool(f.get("remap_failure")),
        )

    def _mem_info(self, index: int) -> tuple[int | None, int | None, int | None]:
        """Used, free and reserved bytes: the v2 struct (which separates reserved memory), else,
        per call, the v1 struct (reserved folded into used; older drivers lack the v2 symbol)."""
        version = getattr(self._lib, "nvmlMemory_v2", None)
        info = None
        if version is not None:
            try:
                info = self._dev("nvmlDeviceGetMemoryInfo", index, version, variant=_MEM_V2)
            except DeviceError:
                info = None
            if info is None and self.missing(_MEM_V2):
                self._problems[_MEM_V2] = (
                    f"{_MEM_V2}: not in this NVML library (driver too old?); memory is read "
                    "through the v1 struct, which counts reserved memory as used"
                )
        if info is None:
            info = self._dev("nvmlDeviceGetMemoryInfo", index)
        if info is None:
            return None, None, None
        reserved = getattr(info, "reserved", None)
        return int(info.used), int(info.free), None if reserved is None else int(reserved)

    def sample_slow(self, index: int) -> Sample:
        lib = self._lib
        now = self._clock()
        f = self._fields(index, F.SLOW_FIELDS)
        energy = f.get("energy_mj")
        if energy is None:
            energy = self._dev("nvmlDeviceGetTotalEnergyConsumption", index)
        replay = f.get("pcie_replay_count")
        if replay is None:
            replay = self._dev("nvmlDeviceGetPcieReplayCounter", index)
        # PCIe throughput from NVML's own 20 ms sample: the byte counters (field ids 197/198)
        # are 32 bits wide and wrap every ~0.08 s at 55 GB/s, so no delta over a slow-tier
        # interval can be trusted (NVML API Reference, nvmlDeviceGetPcieThroughput).
        tx_kb = self._dev("nvmlDeviceGetPcieThroughput", index, lib.NVML_PCIE_UTIL_TX_BYTES)
        rx_kb = self._dev("nvmlDeviceGetPcieThroughput", index, lib.NVML_PCIE_UTIL_RX_BYTES)
        power_ns = f.get("_power_violation_ns")  # field ids replace nvmlDeviceGetViolationStatus
        thermal_ns = f.get("_thermal_violation_ns")
        if power_ns is None:
            pviol = self._dev("nvmlDeviceGetViolationStatus", index, lib.NVML_PERF_POLICY_POWER)
            power_ns = None if pviol is None else int(pviol.violationTime)
        if thermal_ns is None:
            tviol = self._dev("nvmlDeviceGetViolationStatus", index, lib.NVML_PERF_POLICY_THERMAL)
            thermal_ns = None if tviol is None else int(tviol.violationTime)
        enc = self._dev("nvmlDeviceGetEncoderUtilization", index)
        dec = self._dev("nvmlDeviceGetDecoderUtilization", index)
        sbe_pages = self._dev(
            "nvmlDeviceGetRetiredPages",
            index,
            lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        dbe_pages = self._dev(
            "nvmlDeviceGetRetiredPages", index, lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pending_pages = self._dev("nvmlDeviceGetRetiredPagesPendingStatus", index)
        links = self._nvlinks(index, f.get("_nvlink_link_count"))
        bandwidth = None
        if links:
            moved = [x for link in links for x in (link.tx_kib, link.rx_kib) if x is not None]
            bandwidth = sum(moved) if moved else None
        return Sample(
            timestamp_s=now,
            energy_mj=_opt_int(energy),
            pcie_replay_count=_opt_int(replay),
            pcie_tx_bytes_per_s=None if tx_kb is None else float(tx_kb) * 1024.0,
            pcie_rx_bytes_per_s=None if rx_kb is None else float(rx_kb) * 1024.0,
            ecc_sbe_aggregate=_opt_int(f.get("ecc_sbe_aggregate")),
            ecc_dbe_aggregate=_opt_int(f.get("ecc_dbe_aggregate")),
            nvlink_crc_errors=_opt_int(f.get("nvlink_crc_errors")),
            nvlink_replay_errors=_opt_int(f.get("nvlink_replay_errors")),
            nvlink_recovery_errors=_opt_int(f.get("nvlink_recovery_errors")),
            nvlink_crc_flit_errors=_opt_int(f.get("nvlink_crc_flit_errors")),
            nvlink_bandwidth_kib=bandwidth,
            nvlink_links=links,
            power_violation_us=None if power_ns is None else int(power_ns) // 1000,
            thermal_violation_us=None if thermal_ns is None else int(thermal_ns) // 1000,
            enc_util_pct=None if enc is None else float(enc[0]),
            dec_util_pct=None if dec is None else float(dec[0]),
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            retired_pages_pending=None if pending_pages is None else bool(pending_pages),
        )

    def _nvlinks(self, index: int, count: float | int | None) -> tuple[NvLinkCounters, ...] | None:
        """Every NVLink's state and counters in one batched field-values call (``scopeId`` =
        link); None when the GPU has no NVLink (the link count is not supported or 0)."""
        if not count:
            return None
        n = min(int(count), F.NVLINK_MAX_LINKS)
        ids = [(fid, link) for link in range(n) for fid in F.NVLINK_LINK_FIELDS]
        values = self._dev("nvmlDeviceGetFieldValues", index, ids)
        if values is None:
            return None
        per_link: dict[int, dict[str, int | bool | None]] = {link: {} for link in range(n)}
        for (fid, link), v in zip(ids, F.field_values(values), strict=False):
            attr = F.NVLINK_LINK_FIELDS[fid]
            if v is None:
                per_link[link][attr] = None
            elif attr == "active":
                per_link[link][attr] = int(v) == 1  # NVML_NVLINK_STATE_ACTIVE
            else:
                per_link[link][attr] = int(v)
        return tuple(NvLinkCounters(link, **vals) for link, vals in per_link.items())  # type: ignore[arg-type]

    def running_processes(self, index: int) -> list[tuple[int, int | None]] | None:
        """(pid, GPU memory bytes) of the compute processes on a GPU; None if NVML can't tell."""
        procs = self._dev_successor(
            "nvmlDeviceGetComputeRunningProcesses",  # the _v3 symbol, by pynvml's wrapper
            "nvmlDeviceGetComputeRunningProcesses_v2",
            index,
        )
        if procs is None:
            return None
        out: list[tuple[int, int | None]] = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if used is None else int(used)))
        return sorted(out)

    def sample(self, index: int) -> Sample:
        fast = self.sample_fast(index)
        return fast.merged(replace(self.sample_slow(index), timestamp_s=fast.timestamp_s))

    def poll_events(self, timeout_ms: int = 0) -> list[GpuEvent]:
        """XID events pending in NVML's event set, plus one `gpu_lost` per newly lost GPU."""
        lib = self._lib
        events: list[GpuEvent] = []
        now = self._clock()
        for idx in sorted(self._lost - self._lost_reported):
            self._lost_reported.add(idx)
            events.append(GpuEvent(idx, None, "gpu_lost", now, detail="NVML_ERROR_GPU_IS_LOST"))
        if self._event_set is None:
            self._event_set = self.call("nvmlEventSetCreate")
            if self._event_set is None:
                return events
            for idx in range(self.device_count()):
                try:
                    self._dev(
                        "nvmlDeviceRegisterEvents",
                        idx,
                        lib.nvmlEventTypeXidCriticalError,
                        self._event_set,
                    )
                except (GpuLostError, DeviceError):
                    continue
        wait = timeout_ms
        for _ in range(1024):  # bounded drain
            try:
                data = self._lib.nvmlEventSetWait(self._event_set, wait)
            except mismatch_error(self._lib) as exc:
                self._function_not_found("nvmlEventSetWait", f"nvmlEventSetWait: {exc}")
                break
            except self._lib.NVMLError as exc:
                if (
                    int(exc.value) != lib.NVML_ERROR_TIMEOUT
                    and severity_of(int(exc.value)) is NvmlSeverity.ERROR
                ):
                    self._record("nvmlEventSetWait", f"nvmlEventSetWait: {exc}")
                break
            wait = 0
            idx, uuid_text = self._event_gpu(data.device)
            ts = getattr(data, "timeStamp", None)
            events.append(
                GpuEvent(
                    gpu_index=idx,
                    gpu_uuid=uuid_text,
                    kind="xid",
                    timestamp_s=float(ts) / 1e6 if ts else now,
                    xid=int(data.eventData),
                )
            )
        for idx in sorted(self._lost - self._lost_reported):
            self._lost_reported.add(idx)
            events.append(GpuEvent(idx, None, "gpu_lost", now, detail="NVML_ERROR_GPU_IS_LOST"))
        return events

    # ----- power limits and energy (the power advisor) ---------------------------------------
    def power_limit_w(self, index: int) -> float | None:
        """The power limit in force (W), None when NVML does not say."""
        v = self._dev("nvmlDeviceGetPowerManagementLimit", index)
        return None if v is None else float(v) / 1000.0

    def power_limit_constraints_w(self, index: int) -> tuple[float, float] | None:
        """(min, max) settable power limit in W, None when NVML does not say."""
        v = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", index)
        return None if v is None else (float(v[0]) / 1000.0, float(v[1]) / 1000.0)

    def default_power_limit_w(self, index: int) -> float | None:
        """The board's default power limit in W, None when NVML does not say."""
        v = self._dev("nvmlDeviceGetPowerManagementDefaultLimit", index)
        return None if v is None else float(v) / 1000.0

    def total_energy_mj(self, index: int) -> int | None:
        """NVML's total energy counter (mJ since the driver loaded), None where unsupported."""
        v = self._dev("nvmlDeviceGetTotalEnergyConsumption", index)
        return None if v is None else int(v)

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the power limit through NVML; a clear DeviceError when refused (no permission,
        out of range), never a silent no-op."""
        self._ensure_init()
        handle = self._handle(index)
        self.nvml_calls += 1
        try:
            self._lib.nvmlDeviceSetPowerManagementLimit(handle, round(watts * 1000))
        except self._lib.NVMLError as exc:
            code = int(exc.value)
            if code == self._lib.NVML_ERROR_NO_PERMISSION:
                raise DeviceError(
                    f"GPU {index} on {self.node_name}: setting the power limit needs root "
                    f"(NVML_ERROR_NO_PERMISSION)",
                    hint="run as root, or with sudo",
                ) from exc
            if code == self._lib.NVML_ERROR_INVALID_ARGUMENT:
                lim = self.power_limit_constraints_w(index)
                span = f" (allowed {lim[0]:.0f}-{lim[1]:.0f} W)" if lim else ""
                raise DeviceError(
                    f"GPU {index} on {self.node_name}: {watts:.0f} W is not a valid power "
                    f"limit{span}"
                ) from exc
            raise DeviceError(
                f"GPU {index} on {self.node_name}: setting the power limit failed: {exc} "
                f"({error_name(code)})"
            ) from exc

    def reopened(self) -> NvmlBackend:
        """A new backend over the same library, for an agent that closed this one for a
        driver update: NVML is initialised afresh on its first call, and the handles, lost
        GPUs and missing functions are learned again."""
        return NvmlBackend(self._lib, node_name=self.node_name, clock=self._clock)

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                if self._event_set is not None:
                    with contextlib.suppress(self._lib.NVMLError, mismatch_error(self._lib)):
                        self._lib.nvmlEventSetFree(self._event_set)
                    self._event_set = None
                with contextlib.suppress(self._lib.NVMLError, mismatch_error(self._lib)):
                    self._lib.nvmlShutdown()
                self._initialised = False
                self._handles.clear()


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _handle_key(handle: Any) -> Any:
    """A comparable identity for an NVML device handle (a ctypes pointer or a simulator handle)."""
    try:
        import ctypes

        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _mem_total(info: Any) -> int | None:
    return None if info is None else int(info.total)


def _opt_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_bool(v: Any) -> bool | None:
    return None if v is None else bool(v)
