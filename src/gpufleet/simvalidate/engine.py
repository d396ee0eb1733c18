"""The simulator engine: validate's diagnostics over ``gpufleet.devices.sim`` (simulated time).

This package joins the two and sits above both: ``gpufleet.validate`` knows nothing of the
simulator (its pass lines come from the catalog's performance model, which the simulator's
workload times read too), and ``gpufleet.devices`` knows nothing of validate; importing the
package registers this engine as ``sim`` (`gpufleet.validate.engines`).

Time is simulated: the fleet runs on a ``ManualClock`` that this engine advances by the workload
model's durations, so a level-3 run with a 15-minute stress takes seconds of wall time. Every
GPU of every node runs a test at once (as a fleet-wide validation does), the physics trace
(power, temperature, clock, reasons) comes from the simulated GPUs through the production
``NvmlBackend``, and faults change the figures: a slow GPU is slow in every compute test, a
downgraded PCIe link is slow, memory errors show up in the memory test, a HW power brake lowers
the clock, a slow network link slows the pairs of its node.

Figures carry a small seeded spread (uniform +-1 %) so fleet statistics see peers that differ,
as real GPUs do; the same seed gives the same figures.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gpufleet.catalog import performance as perf
from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.sim import physics as ph
from gpufleet.devices.sim import workload as wl
from gpufleet.devices.sim.clock import ManualClock
from gpufleet.devices.sim.faults import FaultKind
from gpufleet.devices.sim.fleet import SimFleet
from gpufleet.devices.sim.gpu import Load, SimGpu
from gpufleet.validate import judge
from gpufleet.validate import thresholds as th
from gpufleet.validate.collectives import message_sizes, row
from gpufleet.validate.judge import Target
from gpufleet.validate.results import CollectiveRow, TestResult, TracePoint

SPREAD = 0.01
MATMUL_N = 8192  # square matmuls, as in load_trace.json
MATMUL_ITERS = 50
COPY_BYTES = 2 * 2**30
COPY_ITERS = 20
PCIE_BYTES = 2**30
PCIE_ITERS = 10
MEM_PATTERNS = ["0x00000000", "0xffffffff", "0xaaaaaaaa", "address"]
MEM_FRACTION = 0.92
COLL_ITERS = 20
PAIR_BYTES = 2**30
PAIR_ITERS = 10
P2P_BYTES = 2**30
P2P_ITERS = 5
TRACE_POINTS = 30  # simulated trace samples per run (physics settles in ~30 s)
POWER_INTENSITY = 1.3  # targeted power: heavier than a bf16 matmul, so the cap is reached


class SimEngine:
    """Runs the suite's device tests on a simulated fleet."""

    name = "sim"

    def __init__(self, fleet: SimFleet, clock: ManualClock, nodes: list[str] | None = None) -> None:
        self.fleet = fleet
        self.clock = clock
        self.seed = fleet.spec.seed
        names = nodes if nodes else list(fleet.nodes)
        self._backends: dict[str, GpuBackend] = {n: fleet.node(n).backend() for n in names}

    # ----- plumbing ------------------------------------------------------------------------
    def backends(self) -> dict[str, GpuBackend]:
        return dict(self._backends)

    def now(self) -> float:
        return self.clock()

    def sleep(self, seconds: float) -> None:
        """Wait on the simulation's clock (the health window of level 1 costs no wall time)."""
        self.clock.advance(seconds)

    def cuda_usable(self, node: str, gpu: int) -> tuple[bool, str]:
        g = self._gpu(node, gpu)
        return (False, "GPU is lost") if g.lost else (True, "ok")

    def _gpu(self, node: str, gpu: int) -> SimGpu:
        return self.fleet.node(node).gpus[gpu]

    def _noise(self, *key: object) -> float:
        rng = random.Random(":".join(map(str, (self.seed, *key))))
        return 1.0 + rng.uniform(-SPREAD, SPREAD)

    def _run_phase(self, targets: list[Target], load: Load, seconds: float) -> None:
        for t in targets:
            self._gpu(t.node, t.gpu).run(load, start_s=self.clock(), duration_s=seconds)
        self.clock.advance(seconds)

    def _burst_clock_ratio(self, t: Target, load: Load) -> float:
        """Clock under a short load relative to a healthy GPU's (HW slowdowns lower it)."""
        g = self._gpu(t.node, t.gpu)
        limit = float(g.power_limit_w or g.model.max_power_w)
        healthy, _p, _c = ph.steady_clock_and_power(
            g.params, limit, load.util, load.intensity, None
        )
        s = self._backends[t.node].sample_fast(t.gpu)
        clock = float(s.sm_clock_mhz or 0)
        return min(1.0, clock / healthy) if healthy else 1.0

    # ----- level 2 -------------------------------------------------------------------------
    def pcie_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        out = []
        seconds = 0.0
        for t in targets:
            assert t.model is not None
            gen, width = self._gpu(t.node, t.gpu).pcie_link()
            figs = {}
            for d in ("h2d", "d2h"):
                secs = wl.pcie_seconds(t.model, PCIE_BYTES, gen=gen, width=width, direction=d)
                secs /= self._noise(t.node, t.gpu, "pcie", d)
                figs[d] = PCIE_BYTES / secs / 1e9
                seconds = max(seconds, 2 * secs * PCIE_ITERS)
            info = self._backends[t.node].device_info(t.gpu)
            out.append(
                judge.pcie(
                    t, figs["h2d"], figs["d2h"], info.pcie_gen_current, info.pcie_width_current, thr
                )
            )
        self._run_phase(targets, Load(util=0.1, intensity=0.1, kind="pcie_copy"), seconds)
        return out

    def hbm_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        out = []
        seconds = 0.0
        for t in targets:
            assert t.model is not None
            secs = wl.copy_seconds(t.model, COPY_BYTES) / self._noise(t.node, t.gpu, "hbm")
            out.append(judge.hbm(t, 2 * COPY_BYTES / secs / 1e9, thr))
            seconds = max(seconds, secs * COPY_ITERS)
        self._run_phase(targets, Load(util=1.0, intensity=0.5, mem_util=0.95, kind="copy"), seconds)
        return out

    def memory(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        out = []
        seconds = 0.0
        for t in targets:
            assert t.model is not None
            s = self._backends[t.node].sample_fast(t.gpu)
            free = int(s.mem_free_bytes or 0)
            tested = int(free * MEM_FRACTION) // 2**20 * 2**20
            errors = self._gpu(t.node, t.gpu).memory_error_addresses()
            out.append(judge.memory(t, tested, free, errors, MEM_PATTERNS))
            per_pattern = 2 * wl.copy_seconds(t.model, tested)  # write, then read and compare
            seconds = max(seconds, per_pattern * len(MEM_PATTERNS))
        self._run_phase(
            targets, Load(util=1.0, intensity=0.5, mem_util=0.95, kind="memtest"), seconds
        )
        return out

    def matmul(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        out = []
        load = Load(util=1.0, intensity=1.0, kind="bf16_matmul")
        for t in targets:
            self._gpu(t.node, t.gpu).run(load, start_s=self.clock(), duration_s=1.0)
        self.clock.advance(0.5)
        seconds = 0.0
        for t in targets:
            assert t.model is not None
            ratio = self._burst_clock_ratio(t, load)
            speed = self._gpu(t.node, t.gpu).slow_fraction()
            figures: dict[str, tuple[float, bool, float]] = {}
            skipped = []
            for dtype in th.MATMUL_DTYPES:
                if perf.matmul_tflops(t.model, dtype) is None:
                    skipped.append(dtype)
                    continue
                n = MATMUL_N
                secs = wl.matmul_seconds(t.model, dtype, n, n, n, speed=speed, clock_ratio=ratio)
                secs /= self._noise(t.node, t.gpu, "matmul", dtype)
                seconds += secs * MATMUL_ITERS
                err = 1e-3 * self._noise(t.node, t.gpu, "err", dtype)
                figures[dtype] = (2.0 * n**3 / secs / 1e12, True, err)
            out.append(judge.matmul(t, figures, skipped, thr))
        self._run_phase(targets, load, max(0.0, seconds / max(1, len(targets)) - 0.5))
        return out

    def nvlink_p2p(self, node: str, targets: list[Target]) -> dict[int, dict[int, float]]:
        """Peer-to-peer copy bandwidth of every GPU pair of a node (GB/s, one direction): the
        catalog's figure, slowed on a GPU whose NVLink replays or retrains (nvlink_errors)."""
        model = targets[0].model
        assert model is not None
        full = perf.p2p_gbps(model) or 0.0
        idx = [t.gpu for t in targets]
        matrix: dict[int, dict[int, float]] = {i: {} for i in idx}
        for n, a in enumerate(idx):
            for b in idx[n + 1 :]:
                frac = min(
                    self._gpu(node, a).nvlink_fraction(), self._gpu(node, b).nvlink_fraction()
                )
                bw = full * frac * self._noise(node, "p2p", a, b)
                matrix[a][b] = matrix[b][a] = bw
        pairs = len(idx) * (len(idx) - 1)
        seconds = pairs * P2P_ITERS * P2P_BYTES / (full * 1e9) if full else 0.0
        load = Load(util=0.3, intensity=0.2, kind="nvlink_p2p", nvlink_bytes_per_s=full * 1e9)
        self._run_phase([t for t in targets if t.node == node], load, seconds)
        return matrix

    # ----- level 3 -------------------------------------------------------------------------
    def _trace(
        self,
        targets: list[Target],
        load: Load,
        duration_s: float,
        on_point: Callable[[float], None] | None = None,
    ) -> dict[tuple[str, int], list[TracePoint]]:
        for t in targets:
            self._gpu(t.node, t.gpu).stop(self.clock())
            self._gpu(t.node, t.gpu).run(load, start_s=self.clock(), duration_s=duration_s)
        start = self.clock()
        traces: dict[tuple[str, int], list[TracePoint]] = {(t.node, t.gpu): [] for t in targets}
        step = duration_s / TRACE_POINTS
        for _ in range(TRACE_POINTS):
            self.clock.advance(step)
            for t in targets:
                s = self._backends[t.node].sample_fast(t.gpu)
                traces[(t.node, t.gpu)].append(
                    TracePoint(
                        round(self.clock() - start, 3),
                        s.power_w,
                        s.gpu_temp_c,
                        s.sm_clock_mhz,
                        s.clock_event_reasons,
                    )
                )
            if on_point:
                on_point(self.clock() - start)
        return traces

    def stress(
        self,
        targets: list[Target],
        thr: th.Thresholds,
        duration_s: float,
        traces_out: dict[str, list[TracePoint]],
    ) -> list[TestResult]:
        load = Load(util=1.0, intensity=1.0, kind="bf16_matmul", fb_used_bytes=60 * 2**30)
        traces = self._trace(targets, load, duration_s)
        out = []
        for t in targets:
            assert t.model is not None
            g = self._gpu(t.node, t.gpu)
            tr = traces[(t.node, t.gpu)]
            maxclk = float(t.model.max_sm_clock_mhz or g.params.max_sm_clock_mhz)
            half = tr[len(tr) // 2 :]
            clock = sum(float(p.sm_clock_mhz or 0) for p in half) / len(half)
            burst_ratio = min(
                1.0,
                (tr[0].sm_clock_mhz or 0)
                / ph.steady_clock_and_power(g.params, float(g.power_limit_w or 0), 1.0, 1.0, None)[
                    0
                ],
            )
            base = (perf.matmul_tflops(t.model, "bf16") or 0.0) * g.slow_fraction()
            base *= self._noise(t.node, t.gpu, "stress")
            burst = base * perf.clock_factor(burst_ratio)
            sustained = base * perf.clock_factor(clock / maxclk)
            info = self._backends[t.node].device_info(t.gpu)
            traces_out[f"{t.node}/gpu{t.gpu}"] = tr
            out.append(judge.stress(t, burst, sustained, tr, info.power_limit_enforced_w, thr))
        return out

    def targeted_power(
        self, targets: list[Target], thr: th.Thresholds, duration_s: float
    ) -> list[TestResult]:
        load = Load(util=1.0, intensity=POWER_INTENSITY, kind="targeted_power")
        traces = self._trace(targets, load, duration_s)
        out = []
        for t in targets:
            tr = traces[(t.node, t.gpu)]
            half = [p.power_w or 0.0 for p in tr[len(tr) // 2 :]]
            info = self._backends[t.node].device_info(t.gpu)
            out.append(
                judge.targeted_power(t, sum(half) / len(half), info.power_limit_enforced_w, thr)
            )
        return out

    def _link_fraction(self, node: str, peer: str | None = None) -> float:
        """How fast a node's network link runs (SLOW_LINK; with ``peer``, only that pair)."""
        frac = 1.0
        for g in self.fleet.node(node).gpus:
            f = g.has_fault(FaultKind.SLOW_LINK)
            if f is None:
                continue
            only = f.param("peer", None)
            if only is None or only == peer:
                frac = min(frac, float(f.param("fraction", 0.5)))
        return frac

    def _collective_rows(
        self, n: int, busbw: dict[str, float], key: str
    ) -> tuple[list[CollectiveRow], float]:
        rows, seconds = [], 0.0
        for op in perf.COLLECTIVES:
            for size in message_sizes():
                secs = wl.collective_seconds(op, size, n, busbw[op]) / self._noise(key, op, size)
                rows.append(row(op, size, secs, n))
                seconds += secs * COLL_ITERS
        return rows, seconds

    def collectives(
        self, node: str, targets: list[Target], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]:
        model = targets[0].model
        assert model is not None
        expected = perf.expected_busbw_by_op(model, 1, len(targets))
        # a ring or tree waits for its slowest hop: one GPU's bad NVLink slows every rank
        slowest = min(self._gpu(t.node, t.gpu).nvlink_fraction() for t in targets)
        noise = self._noise(node, "coll") * slowest
        rows, seconds = self._collective_rows(
            len(targets), {op: v * noise for op, v in expected.items()}, node
        )
        self._run_phase(targets, Load(util=0.6, intensity=0.3, kind="nccl"), seconds)
        res = judge.collectives(node, "collectives", rows, len(targets), expected, thr)
        return res, rows

    def multinode_collectives(
        self, by_node: dict[str, list[Target]], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]:
        """Across nodes: each op at the fabric's figure (`perf.expected_busbw`), the network
        share scaled by the slowest node link (a collective waits for its slowest hop)."""
        all_t = [t for ts in by_node.values() for t in ts]
        model = all_t[0].model
        assert model is not None
        per_node = max(len(ts) for ts in by_node.values())
        nodes = len(by_node)
        slowest = min(self._link_fraction(n) for n in by_node)
        expected = perf.expected_busbw_by_op(model, nodes, per_node)
        actual = perf.expected_busbw_by_op(model, nodes, per_node, net_fraction=slowest)
        noise = self._noise("fleet", "coll")
        rows, seconds = self._collective_rows(
            len(all_t), {op: v * noise for op, v in actual.items()}, "fleet"
        )
        self._run_phase(all_t, Load(util=0.6, intensity=0.3, kind="nccl"), seconds)
        res = judge.collectives("fleet", "multinode_collectives", rows, len(all_t), expected, thr)
        return res, rows

    def pairwise(self, nodes: list[str]) -> dict[str, dict[str, float]]:
        """Node-to-node bandwidth (GB/s) of every pair, as measured by one transfer each way."""
        model = self.fleet.node(nodes[0]).gpus[0].model
        full = th.node_network_gbps(model)
        matrix: dict[str, dict[str, float]] = {n: {} for n in nodes}
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                frac = min(self._link_fraction(a, b), self._link_fraction(b, a))
                bw = full * frac * self._noise("pair", a, b)
                matrix[a][b] = matrix[b][a] = bw
        rounds = max(1, len(nodes) - 1)
        self.clock.advance(rounds * PAIR_ITERS * PAIR_BYTES / (full * 1e9))
        return matrix
