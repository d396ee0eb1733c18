"""HPC and rendering: GPUs for a sustained FP64/FP32 FLOP rate and a working set in memory.

Sizing: GPUs by rate = ceil(rate / (peak at the precision x efficiency)); GPUs by memory =
ceil(working set / usable memory per GPU); the larger wins, rounded up to whole servers. A FLOP
budget with a deadline becomes a rate: flops / (days x 86,400 s).

Sources:
- Peaks: the catalog's data-sheet figures (``fp64`` vector, ``fp64_tensor`` DGEMM on tensor
  cores, ``fp32``), dense, TFLOP/s.
- Default efficiency 0.6 (sustained / peak) for dense, HPL-class codes: TOP500 (November 2023)
  lists NVIDIA Eos (DGX H100 SuperPOD) at Rmax 121.4 PFLOP/s of Rpeak 188.65 PFLOP/s = 0.64.
  Bandwidth-bound codes (stencils, sparse solvers; HPCG) sustain a few percent of peak: set
  ``efficiency`` per workload.
- Memory per precision: 8 bytes per fp64 value, 4 per fp32 (IEEE 754 binary64/binary32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_EFFICIENCY", "HpcSizing", "size_hpc"]

DEFAULT_EFFICIENCY = 0.60
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class HpcSizing:
    """GPUs for one HPC/rendering workload and what bounds them."""

    gpus: int
    gpus_by_rate: int | None
    gpus_by_memory: int | None
    precision: str
    peak_path: str
    peak_tflops: float
    efficiency: float
    sustained_tflops: float
    working_set_bytes: float | None
    memory_per_gpu_bytes: float | None
    days: float | None
    bound: str
    notes: tuple[str, ...]


def size_hpc(
    *,
    precision: str,
    peak_path: str,
    peak_tflops: float,
    efficiency: float,
    rate_tflops: float | None,
    flops: float | None,
    target_days: float | None,
    working_set_bytes: float | None,
    capacity_bytes: float,
    gpus: int | None,
    gpus_per_server: int,
) -> HpcSizing:
    """GPUs = max(by rate, by memory), or the given count; whole servers."""
    notes: list[str] = []
    per_gpu = peak_tflops * efficiency
    rate = rate_tflops
    if rate is None and flops is not None and target_days is not None:
        rate = flops / (target_days * SECONDS_PER_DAY) / 1e12
    by_rate = max(1, math.ceil(rate / per_gpu - 1e-9)) if rate is not None else None
    by_mem = (
        max(1, math.ceil(working_set_bytes / capacity_bytes - 1e-9))
        if working_set_bytes is not None
        else None
    )
    if gpus is not None:
        n = gpus
        if by_rate and n < by_rate:
            notes.append(f"{n} GPUs sustain {n * per_gpu:,.0f} TFLOP/s, below the target")
        if by_mem and n < by_mem:
            notes.append(f"{n} GPUs cannot hold the working set; {by_mem} needed")
    else:
        n = max(by_rate or 1, by_mem or 1)
    bound = "given" if gpus else "memory" if (by_mem or 0) > (by_rate or 0) else "FLOP rate"
    n = -(-n // gpus_per_server) * gpus_per_server
    days = flops / (n * per_gpu * 1e12) / SECONDS_PER_DAY if flops is not None else None
    return HpcSizing(
        gpus=n,
        gpus_by_rate=by_rate,
        gpus_by_memory=by_mem,
        precision=precision,
        peak_path=peak_path,
        peak_tflops=peak_tflops,
        efficiency=efficiency,
        sustained_tflops=n * per_gpu,
        working_set_bytes=working_set_bytes,
        memory_per_gpu_bytes=working_set_bytes / n if working_set_bytes is not None else None,
        days=days,
        bound=bound,
        notes=tuple(notes),
    )
