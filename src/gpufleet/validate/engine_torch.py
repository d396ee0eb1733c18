"""The PyTorch engine: real diagnostics on this node's CUDA GPUs (extra ``gpufleet[gpu]``).

Imported lazily, only when validating real GPUs. Timing uses CUDA events; matmuls are checked
against a float64 reference on a slice; PCIe copies use pinned host memory; the memory test
writes and verifies patterns over >= 90 % of free memory in chunks; the stress run samples NVML
in a thread; collectives use ``torch.distributed`` (NCCL on GPUs, gloo on CPU) in local
processes. Nothing here changes a GPU setting (power limit, clocks, MIG).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from gpufleet.devices.backend import GpuBackend
from gpufleet.errors import NoDeviceError
from gpufleet.validate import judge
from gpufleet.validate import thresholds as th
from gpufleet.validate.collectives import message_sizes, row
from gpufleet.validate.judge import Target
from gpufleet.validate.results import CollectiveRow, TestResult, TracePoint

TORCH_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "tf32": "float32",
    "fp32": "float32",
    "fp64": "float64",
    "fp8": "float8_e4m3fn",
}
MATMUL_N = 8192
# Relative error allowed against the float64 reference (per precision: mantissa bits).
MATMUL_TOL = {"bf16": 3e-2, "fp16": 1e-2, "tf32": 1e-2, "fp32": 1e-4, "fp64": 1e-10, "fp8": 1.5e-1}
MEM_CHUNK = 2**30
MEM_PATTERNS = (0x00000000, 0xFFFFFFFF, 0xAAAAAAAA, 0x55555555)


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise NoDeviceError("PyTorch is not installed", hint="pip install 'gpufleet[gpu]'") from exc
    return torch


def cuda_time_s(torch: Any, fn: Any, iters: int, warmup: int = 3) -> float:
    """Seconds per call of ``fn`` measured with CUDA events."""
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0 / iters


def matmul_tflops(
    torch: Any, dev: int, dtype: str, n: int = MATMUL_N, iters: int = 20
) -> tuple[float, bool, float]:
    """(TFLOP/s, correct, max relative error) of an n x n x n matmul in one precision."""
    d = f"cuda:{dev}"
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    g = torch.Generator(device=d).manual_seed(0)
    a32 = torch.randn(n, n, device=d, generator=g)
    b32 = torch.randn(n, n, device=d, generator=g)
    if dtype == "fp8":
        scale = torch.tensor(1.0, device=d)
        a = a32.to(torch.float8_e4m3fn)
        b = b32.to(torch.float8_e4m3fn).t().contiguous().t()

        def fn() -> Any:
            return torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    else:
        tdt = getattr(torch, TORCH_DTYPES[dtype])
        a, b = a32.to(tdt), b32.to(tdt)

        def fn() -> Any:
            return torch.matmul(a, b)

    secs = cuda_time_s(torch, fn, iters)
    out = fn().double()[:256]
    ref = a.double()[:256] @ b.double()
    err = float(((out - ref).abs().max() / ref.abs().max()).item())
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n**3 / secs / 1e12, err <= MATMUL_TOL[dtype], err


def supports(torch: Any, dev: int, dtype: str) -> bool:
    major, _minor = torch.cuda.get_device_capability(dev)
    if dtype == "fp8":
        return bool(major >= 9 and hasattr(torch, "float8_e4m3fn"))
    if dtype == "bf16":
        return bool(major >= 8)
    return True


class TorchEngine:
    """Diagnostics on this node's GPUs through PyTorch and CUDA; NVML for identity and traces."""

    name = "torch"

    def __init__(self, backend: GpuBackend, torch: Any) -> None:
        self._backend = backend
        self.torch = torch
        self.node = backend.node_name

    @classmethod
    def open(cls) -> TorchEngine:
        from gpufleet.devices.nvml.backend import NvmlBackend, load_pynvml

        torch = import_torch()
        if not torch.cuda.is_available():
            raise NoDeviceError(
                "CUDA is not available to PyTorch",
                hint="validate a simulated fleet with --sim 2x8xh200",
            )
        return cls(NvmlBackend(lib=load_pynvml(), node_name=socket.gethostname()), torch)

    def backends(self) -> dict[str, GpuBackend]:
        return {self.node: self._backend}

    def now(self) -> float:
        return time.time()

    def cuda_usable(self, node: str, gpu: int) -> tuple[bool, str]:
        try:
            x = self.torch.ones(4, device=f"cuda:{gpu}")
            ok = float((x * 2).sum().item()) == 8.0
            return ok, "ok" if ok else "kernel returned a wrong sum"
        except Exception as exc:  # any CUDA error means unusable
            return False, repr(exc)

    # ----- level 2 -------------------------------------------------------------------------
    def pcie_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        torch, out = self.torch, []
        nbytes = 2**30
        for t in targets:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{t.gpu}")
            with torch.cuda.device(t.gpu):
                h2d = nbytes / cuda_time_s(
                    torch, lambda dev=dev, host=host: dev.copy_(host, non_blocking=True), 10
                )
                d2h = nbytes / cuda_time_s(
                    torch, lambda dev=dev, host=host: host.copy_(dev, non_blocking=True), 10
                )
            info = self._backend.device_info(t.gpu)
            out.append(
                judge.pcie(
                    t, h2d / 1e9, d2h / 1e9, info.pcie_gen_current, info.pcie_width_current, thr
                )
            )
            del host, dev
        return out

    def hbm_bandwidth(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        torch, out = self.torch, []
        nbytes = 2 * 2**30
        for t in targets:
            src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{t.gpu}")
            dst = torch.empty_like(src)
            with torch.cuda.device(t.gpu):
                secs = cuda_time_s(torch, lambda dst=dst, src=src: dst.copy_(src), 20)
            out.append(judge.hbm(t, 2 * nbytes / secs / 1e9, thr))  # read + write
            del src, dst
        return out

    def nvlink_p2p(self, node: str, targets: list[Target]) -> dict[int, dict[int, float]]:
        """GB/s of a 1 GiB device-to-device copy in each direction of every GPU pair (peer
        access enabled by PyTorch where the driver allows it); a pair's figure is the slower
        direction, timed with CUDA events on the source GPU."""
        torch = self.torch
        nbytes = 2**30
        idx = [t.gpu for t in targets]
        bufs = {i: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}") for i in idx}
        seen: dict[tuple[int, int], float] = {}
        for a in idx:
            for b in idx:
                if a == b:
                    continue
                with torch.cuda.device(a):
                    secs = cuda_time_s(
                        torch,
                        lambda a=a, b=b: bufs[b].copy_(bufs[a], non_blocking=True),
                        5,
                    )
                seen[(a, b)] = nbytes / secs / 1e9
        bufs.clear()
        return {a: {b: min(seen[(a, b)], seen[(b, a)]) for b in idx if b != a} for a in idx}

    def memory(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        torch, out = self.torch, []
        for t in targets:
            free, _total = torch.cuda.mem_get_info(t.gpu)
            chunks, tested = [], 0
            try:
                while tested + MEM_CHUNK <= 0.95 * free:
                    chunks.append(
                        torch.empty(MEM_CHUNK // 4, dtype=torch.int32, device=f"cuda:{t.gpu}")
                    )
                    tested += MEM_CHUNK
            except torch.cuda.OutOfMemoryError:
                pass
            bad: list[int] = []
            for pattern in MEM_PATTERNS:
                value = pattern - 2**32 if pattern >= 2**31 else pattern
                for c in chunks:
                    c.fill_(value)
                torch.cuda.synchronize(t.gpu)
                for k, c in enumerate(chunks):
                    idx = torch.nonzero(c != value).flatten()[:16]
                    bad += [k * MEM_CHUNK + 4 * int(i) for i in idx.tolist()]
            del chunks
            torch.cuda.empty_cache()
            out.append(
                judge.memory(
                    t,
                    tested,
                    int(free),
                    sorted(set(bad))[:64],
                    [f"0x{p:08x}" for p in MEM_PATTERNS],
                )
            )
        return out

    def matmul(self, targets: list[Target], thr: th.Thresholds) -> list[TestResult]:
        out = []
        for t in targets:
            figures: dict[str, tuple[float, bool, float]] = {}
            skipped = []
            for dtype in th.MATMUL_DTYPES:
                has_peak = t.model is None or th.expected_matmul_tflops(t.model, dtype)
                if not has_peak or not supports(self.torch, t.gpu, dtype):
                    skipped.append(dtype)
                    continue
                figures[dtype] = matmul_tflops(self.torch, t.gpu, dtype)
            out.append(judge.matmul(t, figures, skipped, thr))
            self.torch.cuda.empty_cache()
        return out

    # ----- level 3 -------------------------------------------------------------------------
    def _burn(
        self, targets: list[Target], seconds: float, dtype: str = "bf16"
    ) -> tuple[dict[int, list[TracePoint]], dict[int, tuple[float, float]]]:
        """bf16 matmuls on every GPU for ``seconds`` with an NVML trace sampled in a thread."""
        torch = self.torch
        traces: dict[int, list[TracePoint]] = {t.gpu: [] for t in targets}
        stop = threading.Event()
        t0 = time.time()

        def sampler() -> None:
            while not stop.wait(1.0):
                for t in targets:
                    s = self._backend.sample_fast(t.gpu)
                    traces[t.gpu].append(
                        TracePoint(
                            round(time.time() - t0, 3),
                            s.power_w,
                            s.gpu_temp_c,
                            s.sm_clock_mhz,
                            s.clock_event_reasons,
                        )
                    )

        th_ = threading.Thread(target=sampler, daemon=True)
        th_.start()
        rates: dict[int, tuple[float, float]] = {}
        try:
            mats = {}
            for t in targets:
                d = f"cuda:{t.gpu}"
                mats[t.gpu] = (
                    torch.randn(MATMUL_N, MATMUL_N, device=d, dtype=torch.bfloat16),
                    torch.randn(MATMUL_N, MATMUL_N, device=d, dtype=torch.bfloat16),
                )
            flop = 2.0 * MATMUL_N**3
            first: dict[int, float] = {}
            count = {t.gpu: 0 for t in targets}
            late = {t.gpu: [0, 0.0] for t in targets}
            while time.time() - t0 < seconds:
                for t in targets:
                    a, b = mats[t.gpu]
                    with torch.cuda.device(t.gpu):
                        secs = cuda_time_s(torch, lambda a=a, b=b: torch.matmul(a, b), 20, 0)
                    count[t.gpu] += 1
                    first.setdefault(t.gpu, flop / secs / 1e12)
                    if time.time() - t0 > seconds / 2:
                        late[t.gpu][0] += 1
                        late[t.gpu][1] += flop / secs / 1e12
            for t in targets:
                n, total = late[t.gpu]
                rates[t.gpu] = (first.get(t.gpu, 0.0), total / n if n else first.get(t.gpu, 0.0))
        finally:
            stop.set()
            th_.join(timeout=5)
        return traces, rates

    def stress(
        self,
        targets: list[Target],
        thr: th.Thresholds,
        duration_s: float,
        traces_out: dict[str, list[TracePoint]],
    ) -> list[TestResult]:
        traces, rates = self._burn(targets, duration_s)
        out = []
        for t in targets:
            traces_out[f"{t.node}/gpu{t.gpu}"] = traces[t.gpu]
            limit = self._backend.device_info(t.gpu).power_limit_enforced_w
            burst, sustained = rates[t.gpu]
            out.append(judge.stress(t, burst, sustained, traces[t.gpu], limit, thr))
        return out

    def targeted_power(
        self, targets: list[Target], thr: th.Thresholds, duration_s: float
    ) -> list[TestResult]:
        traces, _ = self._burn(targets, duration_s)
        out = []
        for t in targets:
            pts = traces[t.gpu][len(traces[t.gpu]) // 2 :]
            power = max((p.power_w or 0.0 for p in pts), default=0.0)
            limit = self._backend.device_info(t.gpu).power_limit_enforced_w
            out.append(judge.targeted_power(t, power, limit, thr))
        return out

    def collectives(
        self, node: str, targets: list[Target], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]:
        rows = run_local_collectives(len(targets), "nccl", max_bytes=8 * 2**30)
        model = targets[0].model
        exp = th.expected_busbw_by_op(model, 1, len(targets)) if model else None
        return judge.collectives(node, "collectives", rows, len(targets), exp, thr), rows

    def multinode_collectives(
        self, by_node: dict[str, list[Target]], thr: th.Thresholds
    ) -> tuple[TestResult, list[CollectiveRow]]:
        raise NoDeviceError("multi-node collectives on real GPUs are not built yet")

    def pairwise(self, nodes: list[str]) -> dict[str, dict[str, float]]:
        raise NoDeviceError("pairwise node tests on real GPUs are not built yet")


# ----- collectives with torch.distributed in local processes ---------------------------------
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


def _collective_worker(
    rank: int, world: int, backend: str, store: str, sizes: list[int], iters: int, queue: Any
) -> None:
    import torch
    import torch.distributed as dist

    # a file store, not a TCP port picked free and handed over (bind, close, reuse: a race)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(rank)
        results = []
        for op in OPS:
            for size in sizes:
                n = max(world, size // 4 // world * world)  # float32 elements, divisible
                buf = torch.ones(n, dtype=torch.float32, device=dev)
                parts = [torch.empty(n // world, device=dev) for _ in range(world)]
                shard = torch.empty(n // world, device=dev)
                out = torch.empty_like(buf)

                def once(
                    op: str = op,
                    buf: Any = buf,
                    parts: Any = parts,
                    shard: Any = shard,
                    out: Any = out,
                ) -> None:
                    if op == "all_reduce":
                        dist.all_reduce(buf)
                    elif op == "all_gather":
                        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, shard)
                    elif op == "reduce_scatter":
                        fn = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
                        fn(shard, buf)
                    elif op == "alltoall":
                        dist.all_to_all_single(out, buf)
                    else:
                        dist.broadcast(buf, src=0)

                once()
                if backend == "nccl":
                    torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    once()
                if backend == "nccl":
                    torch.cuda.synchronize()
                secs = (time.perf_counter() - t0) / iters
                # nccl-tests size: the per-rank buffer (all_gather: the gathered output)
                results.append((op, n * 4, secs))
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def run_local_collectives(
    world: int,
    backend: str = "gloo",
    min_bytes: int = 8,
    max_bytes: int = 8 * 2**30,
    iters: int = 5,
    timeout_s: float = 120.0,
) -> list[CollectiveRow]:
    """Collectives among ``world`` local processes (loopback only); nccl-tests style rows."""
    import multiprocessing as mp
    import tempfile

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    sizes = message_sizes(min_bytes, max_bytes)
    with tempfile.TemporaryDirectory(prefix="gpufleet-rendezvous-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_collective_worker, args=(r, world, backend, store, sizes, iters, queue)
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
        try:
            raw = queue.get(timeout=timeout_s)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return [row(op, size, secs, world) for op, size, secs in raw]
