"""One simulated GPU: identity from the catalog, physics, a load schedule and active faults."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from gpufleet.catalog import GpuModel
from gpufleet.devices.sim import physics as ph
from gpufleet.devices.sim.faults import Fault, FaultKind
from gpufleet.devices.types import ClockEventReason as R

# Bus numbers of the eight GPUs of an HGX baseboard as `nvidia-smi` lists them on a DGX H100.
HGX_BUS_IDS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DEFAULT_DRIVER = "580.159.04"  # the H200 capture's driver (tests/fixtures/nvidia-h200)
DEFAULT_CUDA = 13000
VBIOS_BY_ARCH = {
    "hopper": "96.00.A5.00.1A",
    "ampere": "92.00.45.00.06",
    "blackwell": "97.00.4A.00.01",
}
INFOROM_DEFAULT = "G520.0282.02.02"
# NVLinks per GPU by NVLink generation: V100 6 (gen 2), A100 12 (gen 3), H100/H200 18 (gen 4),
# B200 18 (gen 5). Sources: NVIDIA A100 and H100 datasheets, NVIDIA Blackwell datasheet.
NVLINKS_BY_GENERATION = {2: 6, 3: 12, 4: 18, 5: 18}


@dataclass(frozen=True)
class Load:
    """What runs on the GPU: utilization 0..1, power intensity relative to a bf16 matmul."""

    util: float = 1.0
    intensity: float = 1.0
    mem_util: float = 0.25  # trace: 24-25 % memory-controller util during the bf16 burn
    fb_used_bytes: int = 2 * 2**30
    pcie_tx_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    nvlink_bytes_per_s: float = 0.0  # each way, spread over the active links
    kind: str = "bf16_matmul"
    static: float = 0.0  # share of its power that does not follow the SM clock (catalog.power)


def gpm_shares(load: Load) -> tuple[float, float]:
    """Tensor-pipe and DRAM activity per unit of utilization for a load.

    A bf16 matmul on the H200 showed 93.6 % tensor and 17.3 % DRAM activity at 99.8 % graphics
    activity (tests/fixtures/nvidia-h200/gpm_probe.json ``gpm_load``); other loads scale DRAM
    activity from their memory-controller utilization by the same ratio (17.3 / 25).
    """
    if "matmul" in load.kind:
        return 0.936, 0.173
    return 0.3 if load.kind == "inference" else 0.0, min(1.0, load.mem_util * 0.173 / 0.25)


@dataclass
class _Segment:
    start_s: float
    end_s: float | None
    load: Load


@dataclass
class SimGpu:
    """A simulated GPU. Times are absolute clock seconds; ``t0`` is when the simulation began."""

    model: GpuModel
    index: int
    node: str
    seed: int
    t0: float
    driver_version: str = DEFAULT_DRIVER
    vbios_version: str | None = None
    power_limit_w: float | None = None
    mig_enabled: bool = False
    mig_layout: tuple[str, ...] = ()
    faults: list[Fault] = field(default_factory=list)
    # (min, max) MHz set by nvmlDeviceSetGpuLockedClocks; None: unlocked (the driver default)
    locked_clocks_mhz: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        rng = random.Random(f"{self.seed}:{self.node}:{self.index}")
        self._rng = rng
        hexs = f"{rng.getrandbits(128):032x}"
        self.uuid = f"GPU-{hexs[:8]}-{hexs[8:12]}-{hexs[12:16]}-{hexs[16:20]}-{hexs[20:]}"
        self.serial = str(1650000000000 + rng.randrange(10**10))
        self.pci_bus_id = f"00000000:{HGX_BUS_IDS[self.index % 8] + self.index // 8:02X}:00.0"
        if self.vbios_version is None:
            self.vbios_version = VBIOS_BY_ARCH.get(self.model.architecture, "96.00.00.00.01")
        self.inforom_version = INFOROM_DEFAULT
        if self.power_limit_w is None:
            self.power_limit_w = self.model.max_power_w
        self.params = ph.PhysicsParams.for_model(
            self.model.max_power_w, self.model.idle_power_w, self.model.max_sm_clock_mhz
        )
        self.state = ph.PhysicsState(
            power_w=self.params.idle_w,
            temp_fast_c=0.0,
            temp_slow_c=0.0,
            mem_temp_c=ph.IDLE_MEM_TEMP_C,
            energy_mj=float(rng.randrange(1_000_000, 5_000_000)),
            sm_clock_mhz=ph.IDLE_SM_CLOCK_MHZ,
            reasons=int(R.GPU_IDLE),
        )
        # added to the energy counter NVML reports (an integer, so a test can start it near
        # the 64-bit top without the float state losing precision there)
        self.energy_offset_mj = 0
        self.t = self.t0
        self._segments: list[_Segment] = []
        self._last_load_end: float | None = None
        self._fired: set[int] = set()
        self.pending_events: list[tuple[float, int]] = []  # (time, xid)
        self.ecc_sbe_volatile = 0
        self.ecc_dbe_volatile = 0
        self.ecc_sbe_aggregate = rng.randrange(0, 3)
        self.ecc_dbe_aggregate = 0
        self._sbe_due = 0.0  # corrected errors accrued by a rate, not yet whole
        self.remapped_cor = 0
        self.remapped_unc = 0
        self.pcie_replays = 0.0
        self.pcie_tx_total = float(rng.randrange(10**9, 3 * 10**9))
        self.pcie_rx_total = float(rng.randrange(10**9, 3 * 10**9))
        n_links = NVLINKS_BY_GENERATION.get(self.model.nvlink_generation or 0, 0)
        self.nvlink_count = n_links if self.model.gpu_link.value == "nvlink" else 0
        self.nvlink_crc = [0.0] * self.nvlink_count  # CRC errors per link
        self.nvlink_replay = [0.0] * self.nvlink_count
        self.nvlink_recovery = [0] * self.nvlink_count
        self.nvlink_tx_kib = [0.0] * self.nvlink_count
        self.nvlink_rx_kib = [0.0] * self.nvlink_count
        # GPM activity integrals (busy-seconds), read as ratios over a sampling interval
        self.gr_busy_s = 0.0
        self.tensor_busy_s = 0.0
        self.dram_busy_s = 0.0
        self.power_violation_us = 0.0
        self.thermal_violation_us = 0.0
        self.hang_release = threading.Event()
        self.lock = threading.RLock()

    def mig_instances(self) -> list[tuple[int, str, int]]:
        """(GPU-instance id, profile name, memory MiB) of each instance when MIG is on.

        With no layout given, the GPU is split into as many of its smallest profile as fit.
        """
        if not self.mig_enabled:
            return []
        from gpufleet.catalog import load_catalog

        geometry = load_catalog().mig_geometry(self.model.key)
        if geometry is None:
            return []
        names = self.mig_layout or (geometry.profiles[0].name,) * geometry.profiles[0].max_instances
        mem = self.model.memory_bytes
        return [(i + 1, n, geometry.instance_memory_mib(n, mem)) for i, n in enumerate(names)]

    def energy_counter_mj(self) -> int:
        """NVML's total energy counter: unsigned 64-bit, so it wraps."""
        return (int(self.state.energy_mj) + self.energy_offset_mj) % 2**64

    # ----- load schedule -------------------------------------------------------------------
    def run(
        self, load: Load, start_s: float | None = None, duration_s: float | None = None
    ) -> None:
        """Schedule a load from ``start_s`` (default now) for ``duration_s`` (default forever)."""
        with self.lock:
            start = self.t if start_s is None else start_s
            end = None if duration_s is None else start + duration_s
            self._segments.append(_Segment(start, end, load))

    def stop(self, at_s: float | None = None) -> None:
        """End every running or scheduled load at ``at_s`` (default now)."""
        with self.lock:
            at = self.t if at_s is None else at_s
            for seg in self._segments:
                if seg.end_s is None or seg.end_s > at:
                    seg.end_s = max(seg.start_s, at)

    def load_at(self, t: float) -> Load | None:
        active = [s for s in self._segments if s.start_s <= t and (s.end_s is None or t < s.end_s)]
        return active[-1].load if active else None

    # ----- faults --------------------------------------------------------------------------
    def add_fault(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def active_faults(self, t: float | None = None) -> list[Fault]:
        if not self.faults:
            return []
        elapsed = (self.t if t is None else t) - self.t0
        return [f for f in self.faults if f.active(elapsed)]

    def has_fault(self, kind: FaultKind, t: float | None = None) -> Fault | None:
        for f in self.active_faults(t):
            if f.kind == kind:
                return f
        return None

    @property
    def lost(self) -> bool:
        return self.has_fault(FaultKind.FALLEN_OFF_BUS) is not None

    def slow_fraction(self) -> float:
        f = self.has_fault(FaultKind.SLOW_GPU)
        return float(f.param("fraction")) if f else 1.0

    def pcie_link(self) -> tuple[int, int]:
        f = self.has_fault(FaultKind.PCIE_DOWNGRADE)
        gen, width = self.model.pcie_generation, self.model.pcie_lanes
        if f is None:
            return gen, width
        if "gen" not in f.params and "width" not in f.params:
            return gen, max(1, width // 2)  # the kind's default (faults.DEFAULTS)
        return int(f.param("gen", gen)), int(f.param("width", width))

    def nvlink_fault_link(self) -> int | None:
        """The link an active nvlink_errors fault is on (None: no such fault)."""
        f = self.has_fault(FaultKind.NVLINK_ERRORS)
        if f is None or not self.nvlink_count:
            return None
        return min(int(f.param("link", 0)), self.nvlink_count - 1)

    def nvlink_down(self, link: int) -> bool:
        f = self.has_fault(FaultKind.NVLINK_ERRORS)
        return bool(f and f.param("down", False) and self.nvlink_fault_link() == link)

    def nvlink_fraction(self) -> float:
        """Peer-to-peer bandwidth of this GPU relative to a healthy one."""
        f = self.has_fault(FaultKind.NVLINK_ERRORS)
        return float(f.param("fraction", 1.0)) if f else 1.0

    def memory_error_addresses(self) -> list[int]:
        f = self.has_fault(FaultKind.MEMORY_ERRORS)
        if not f:
            return []
        rng = random.Random(f"{self.seed}:{self.uuid}:memerr")
        n = int(f.param("count"))
        return sorted(rng.randrange(0, self.model.memory_bytes // 8) * 8 for _ in range(n))

    def _fire_fault_events(self, t: float) -> None:
        """Queue the XID that each newly active fault produces, once."""
        xid_of = {
            FaultKind.ECC_DBE: 48,
            FaultKind.ROW_REMAP_FAILURE: 64,
            FaultKind.FALLEN_OFF_BUS: 79,
            FaultKind.ROW_REMAP_PENDING: 63,
        }
        for i, f in enumerate(self.faults):
            if i in self._fired or not f.active(t - self.t0):
                continue
            self._fired.add(i)
            when = self.t0 + f.at_s
            if f.kind == FaultKind.XID:
                self.pending_events.append((when, int(f.param("xid"))))
            elif f.kind in xid_of:
                self.pending_events.append((when, xid_of[f.kind]))
            if f.kind == FaultKind.ECC_DBE:
                n = int(f.param("count", 1))
                self.ecc_dbe_volatile += n
                self.ecc_dbe_aggregate += n
                self.remapped_unc += n
            elif f.kind == FaultKind.ECC_SBE and "count" in f.params:
                n = int(f.param("count", 1))
                self.ecc_sbe_volatile += n
                self.ecc_sbe_aggregate += n
            elif f.kind == FaultKind.ROW_REMAP_PENDING:
                self.remapped_cor += 1
            elif f.kind == FaultKind.NVLINK_ERRORS and self.nvlink_count:
                link = min(int(f.param("link", 0)), self.nvlink_count - 1)
                self.nvlink_recovery[link] += int(f.param("recovery", 0))

    # ----- physics -------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Integrate the physics from the last update to ``now`` (lazy; called on every query)."""
        with self.lock:
            if now <= self.t:
                return
            total = now - self.t
            # Power, temperatures and energy integrate exactly over a step with constant load
            # (first-order lags), so steps may be long; they stop at every load or fault change.
            step = 0.05 if total <= 0.5 else 1.0
            while self.t < now - 1e-9:
                dt = min(step, now - self.t, max(self._next_change(self.t) - self.t, 1e-6))
                self._step(self.t + dt, dt)
                self.t += dt
            self._fire_fault_events(now)

    def _next_change(self, t: float) -> float:
        """The first load-segment or fault boundary after ``t`` (inf if none)."""
        points = [seg.start_s for seg in self._segments] + [
            seg.end_s for seg in self._segments if seg.end_s is not None
        ]
        for f in self.faults:
            points.append(self.t0 + f.at_s)
            if f.duration_s is not None:
                points.append(self.t0 + f.at_s + f.duration_s)
        if self._last_load_end is not None:
            points.append(self._last_load_end + ph.LINGER_S)
        later = [x for x in points if x > t + 1e-9]
        return min(later) if later else float("inf")

    def _step(self, t_end: float, dt: float) -> None:
        """Advance one step ending at ``t_end``. Steps never straddle a load or fault change,
        so the conditions are read at the step's middle."""
        p, s = self.params, self.state
        assert self.power_limit_w is not None
        limit = float(self.power_limit_w)
        t = t_end - dt / 2
        load = self.load_at(t)
        clock_cap: float | None = None
        reasons = 0
        thermal = self.has_fault(FaultKind.THERMAL_SLOWDOWN, t)
        brake = self.has_fault(FaultKind.HW_POWER_BRAKE, t)
        if thermal:
            clock_cap = 0.5 * p.max_sm_clock_mhz
            reasons |= R.HW_THERMAL_SLOWDOWN | R.HW_SLOWDOWN
        if brake:
            clock_cap = min(clock_cap or p.max_sm_clock_mhz, 0.3 * p.max_sm_clock_mhz)
            reasons |= R.HW_POWER_BRAKE_SLOWDOWN | R.HW_SLOWDOWN
        locked = self.locked_clocks_mhz
        if locked is not None:  # the power cap and slowdowns still apply (physics module doc)
            clock_cap = min(clock_cap or p.max_sm_clock_mhz, float(locked[1]))
        if load is not None and load.util > 0:
            clock, power_target, capped = ph.steady_clock_and_power(
                p, limit, load.util, load.intensity, clock_cap, load.static
            )
            if capped:
                reasons |= R.SW_POWER_CAP
                self.power_violation_us += dt * 1e6
            self._last_load_end = t_end
            self.pcie_tx_total += load.pcie_tx_bytes_per_s * dt
            self.pcie_rx_total += load.pcie_rx_bytes_per_s * dt
            tensor, dram = gpm_shares(load)
            self.gr_busy_s += load.util * dt
            self.tensor_busy_s += load.util * tensor * dt
            self.dram_busy_s += load.util * dram * dt
        elif self._last_load_end is not None and t - self._last_load_end < ph.LINGER_S:
            clock = p.max_sm_clock_mhz if clock_cap is None else clock_cap
            power_target = p.idle_w + p.linger_w
        elif locked is not None and locked[0] > ph.IDLE_SM_CLOCK_MHZ:  # held up while idle
            clock = min(float(locked[0]), clock_cap or p.max_sm_clock_mhz)
            power_target = ph.clocked_idle_power(p, clock / p.max_sm_clock_mhz)
        else:
            clock = ph.IDLE_SM_CLOCK_MHZ
            power_target = p.idle_w
            reasons |= R.GPU_IDLE
        if thermal:
            self.thermal_violation_us += dt * 1e6
        s.energy_mj += ph.lag_integral(s.power_w, power_target, dt, ph.TAU_POWER_S) * 1000.0
        s.power_w = ph.lag(s.power_w, power_target, dt, ph.TAU_POWER_S)
        rise = p.r_c_per_w * (s.power_w - p.idle_w)
        s.temp_fast_c = ph.lag(s.temp_fast_c, ph.TEMP_FAST_FRACTION * rise, dt, ph.TAU_TEMP_FAST_S)
        s.temp_slow_c = ph.lag(
            s.temp_slow_c, (1 - ph.TEMP_FAST_FRACTION) * rise, dt, ph.TAU_TEMP_SLOW_S
        )
        mem_target = ph.IDLE_MEM_TEMP_C + p.r_mem_c_per_w * (s.power_w - p.idle_w)
        s.mem_temp_c = ph.lag(s.mem_temp_c, mem_target, dt, ph.TAU_MEM_TEMP_S)
        s.sm_clock_mhz = clock
        s.reasons = int(reasons)
        for f in self.active_faults(t):
            rate = float(f.param("rate_per_min", 0.0))
            if f.kind == FaultKind.PCIE_REPLAYS:
                self.pcie_replays += rate * dt / 60.0
            elif f.kind == FaultKind.ECC_SBE and rate:
                # whole errors at a steady rate (deterministic, as every fault is)
                self._sbe_due += rate * dt / 60.0
                n = int(self._sbe_due)
                self._sbe_due -= n
                self.ecc_sbe_volatile += n
                self.ecc_sbe_aggregate += n
            elif f.kind == FaultKind.NVLINK_ERRORS and self.nvlink_count:
                link = min(int(f.param("link", 0)), self.nvlink_count - 1)
                crc = rate * dt / 60.0
                self.nvlink_crc[link] += crc
                self.nvlink_replay[link] += crc / 10.0  # a replay per ~10 CRC-failed flits
        if load is not None and load.nvlink_bytes_per_s and self.nvlink_count:
            up = [i for i in range(self.nvlink_count) if not self.nvlink_down(i)]
            per_link = load.nvlink_bytes_per_s * dt / 1024.0 / max(1, len(up))
            for i in up:
                self.nvlink_tx_kib[i] += per_link
                self.nvlink_rx_kib[i] += per_link

    # ----- readings ------------------------------------------------------------------------
    @property
    def temp_c(self) -> float:
        t = ph.IDLE_TEMP_C + self.state.temp_fast_c + self.state.temp_slow_c
        if self.has_fault(FaultKind.THERMAL_SLOWDOWN) and self.model.slowdown_temp_c:
            t = max(t, self.model.slowdown_temp_c + 2.0)
        return t

    def sm_clock_reading(self) -> int:
        """The SM clock as NVML reports it: 15 MHz steps, a little seeded jitter under the cap."""
        clock = self.state.sm_clock_mhz
        if self.state.reasons & R.SW_POWER_CAP:
            clock += self._rng.choice((-15.0, 0.0, 0.0, 15.0))
        return int(round(clock / 15.0) * 15) if clock > ph.IDLE_SM_CLOCK_MHZ else int(clock)

    def util_reading(self) -> tuple[int, int]:
        load = self.load_at(self.t)
        if load is None:
            return 0, 0
        return round(load.util * 100), round(load.mem_util * 100)

    def fb_used_bytes(self) -> int:
        load = self.load_at(self.t)
        base = 615 * 2**20  # trace: 615 MiB used at idle (driver reservation excluded)
        return base + (load.fb_used_bytes if load else 0)
