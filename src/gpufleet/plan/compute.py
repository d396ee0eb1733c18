"""Compute sizing: training FLOPs and time, GPU counts by memory and deadline, inference throughput.

Sources:
- Training compute C = 6 N D FLOPs (N parameters, D tokens): Kaplan et al. 2020, "Scaling Laws for
  Neural Language Models", section 2.1; Hoffmann et al. 2022 ("Chinchilla"), "Training
  Compute-Optimal Large Language Models".
- Model FLOPs utilization (MFU) and its 0.35-0.55 range on large GPU clusters: Chowdhery et al.
  2022, "PaLM" (46.2 % MFU), Korthikanti et al. 2022 (up to 56 % on 1T-parameter GPT); default 0.40.
- Inference: a decode step reads all weights plus the live KV cache from HBM (memory-bandwidth
  bound); prefill and decode each cost 2 N FLOPs per token (compute bound).
- Tensor parallelism splits attention by heads, so its size must divide the attention heads and
  the KV heads: Megatron-LM (``arguments.py``: "num_attention_heads must be divisible by
  tensor_model_parallel_size", likewise ``num_query_groups``). For serving, vLLM also accepts a
  size that is a multiple of the KV heads and then replicates each KV head tp / kv_heads times
  (vLLM ``QKVParallelLinear``), which the KV-cache memory here counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.plan.memory import (
    Architecture,
    TrainingMemory,
    kv_cache_bytes,
    min_data_parallel,
    training_memory,
)

__all__ = [
    "MFU_RANGE",
    "InferenceSizing",
    "TrainingSizing",
    "gpus_for_deadline",
    "size_inference",
    "size_training",
    "tp_divides_heads",
    "train_flops",
    "training_seconds",
]

MFU_RANGE = (0.35, 0.55)
SECONDS_PER_DAY = 86_400.0


def train_flops(parameters: float, tokens: float) -> float:
    """C = 6 N D (Kaplan et al. 2020)."""
    return 6.0 * parameters * tokens


def training_seconds(flops: float, gpus: int, peak_tflops: float, mfu: float) -> float:
    """time = FLOPs / (GPUs x dense peak x MFU)."""
    return flops / (gpus * peak_tflops * 1e12 * mfu)


def gpus_for_deadline(flops: float, seconds: float, peak_tflops: float, mfu: float) -> int:
    """Fewest GPUs that finish ``flops`` within ``seconds``."""
    return max(1, math.ceil(flops / (seconds * peak_tflops * 1e12 * mfu) - 1e-9))


def tp_divides_heads(tp: int, heads: int, kv_heads: int, *, serving: bool = False) -> bool:
    """Whether a tensor-parallel size splits the attention evenly (see the module's sources)."""
    if heads % tp:
        return False
    return kv_heads % tp == 0 or (serving and tp % kv_heads == 0)


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class TrainingSizing:
    """GPUs for one training workload on one GPU model, and how long it takes."""

    gpus: int
    gpus_by_memory: int
    gpus_by_deadline: int | None
    memory: TrainingMemory
    flops: float
    peak_tflops: float
    mfu: float
    days: float
    days_range: tuple[float, float]
    tokens_per_s: float
    fits: bool
    notes: tuple[str, ...]


def size_training(
    arch: Architecture,
    *,
    tokens: float,
    seq: int,
    global_batch: int,
    micro_batch: int,
    zero_stage: int,
    tp: int | None,
    pp: int | None,
    dp: int | None,
    sequence_parallel: bool,
    recompute: str,
    capacity_bytes: float,
    peak_tflops: float,
    mfu: float,
    target_days: float | None,
    gpus: int | None,
    gpus_per_server: int,
    heads_known: bool = True,
) -> TrainingSizing:
    """Choose (tp, pp, dp) and a GPU count: the larger of the memory and deadline minimums.

    ``None`` degrees are "auto": tensor parallelism stays inside a server (<= gpus_per_server),
    pipeline parallelism up to the layer count, both powers of two; the smallest model-parallel
    group that fits wins (ties: more tensor parallelism). The count rounds up to whole servers and
    to a multiple of tp x pp.
    """
    notes: list[str] = []
    flops = train_flops(arch.parameters, tokens)
    n_time = (
        gpus_for_deadline(flops, target_days * SECONDS_PER_DAY, peak_tflops, mfu)
        if target_days
        else None
    )
    tps = [tp] if tp else _powers_of_two(gpus_per_server)
    if heads_known and not tp:
        tps = [t for t in tps if tp_divides_heads(t, arch.heads, arch.kv_heads)]
    pps = [pp] if pp else _powers_of_two(arch.layers)

    def memory(t: int, p: int, d: int) -> TrainingMemory:  # per GPU with (tp, pp, dp) = (t, p, d)
        return training_memory(
            arch,
            seq=seq,
            micro_batch=micro_batch,
            zero_stage=zero_stage,
            tp=t,
            pp=p,
            dp=d,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            capacity_bytes=capacity_bytes,
        )

    layouts: list[tuple[int, int, int, int, int]] = []  # (n_mem, tp*pp, -tp, tp, pp)
    for t in tps:
        for p in pps:
            d_min = min_data_parallel(arch, zero_stage, memory(t, p, 1))
            if d_min is None or (dp and dp < d_min):
                continue
            d_use = dp or d_min
            layouts.append((t * p * d_use, t * p, -t, t, p))
    fits = bool(layouts)
    if layouts:
        n_mem, _, _, t, p = min(layouts)
    else:
        # Nothing fits: report the largest layout tried, flagged.
        t, p = tps[-1], pps[-1]
        n_mem = t * p * (dp or 1)
        notes.append(
            "the model does not fit in GPU memory with any layout tried; raise tensor/pipeline "
            "parallelism, the ZeRO stage, or use activation recomputation"
        )
    group = t * p
    if gpus:
        n = gpus
        if n % group:
            notes.append(f"{n} GPUs is not a multiple of tp x pp = {group}; rounded up")
        n = _round_up(n, group)
    else:
        n = max(n_mem, n_time or 0)
    n = _round_up(_round_up(n, group), math.lcm(group, gpus_per_server))
    d = dp or n // group
    if dp and t * p * dp != n:
        d = n // group
        notes.append(f"data_parallel {dp} raised to {d} to fill whole servers / the deadline")
    if d * micro_batch > global_batch:
        notes.append(
            f"data parallel {d} x micro-batch {micro_batch} exceeds the global batch "
            f"{global_batch}: step efficiency will suffer; raise the global batch"
        )
    mem = memory(t, p, d)
    secs = training_seconds(flops, n, peak_tflops, mfu)
    lo = training_seconds(flops, n, peak_tflops, MFU_RANGE[1]) / SECONDS_PER_DAY
    hi = training_seconds(flops, n, peak_tflops, MFU_RANGE[0]) / SECONDS_PER_DAY
    return TrainingSizing(
        gpus=n,
        gpus_by_memory=n_mem,
        gpus_by_deadline=n_time,
        memory=mem,
        flops=flops,
        peak_tflops=peak_tflops,
        mfu=mfu,
        days=secs / SECONDS_PER_DAY,
        days_range=(lo, hi),
        tokens_per_s=tokens / secs,
        fits=fits and mem.fits,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class InferenceSizing:
    """GPUs to serve a model at a target token rate and concurrency."""

    gpus: int
    replicas: int
    gpus_per_replica: int
    weights_bytes: float
    kv_bytes_per_sequence: float
    memory_per_gpu_bytes: float
    decode_tokens_per_s: float
    decode_bound: str
    prefill_tokens_per_s: float
    fits: bool
    notes: tuple[str, ...]
    # Nodes one replica spans: 1 when tensor (and pipeline) parallelism stays inside a server,
    # so replicas exchange nothing and need no compute (east-west) fabric.
    nodes_per_replica: int = 1


def _decode_rate(
    *,
    replicas: int,
    r: int,
    weights: float,
    kv_seq: float,
    concurrent: int,
    bw: float,
    flops_per_token: float,
    peak: float,
) -> tuple[float, str]:
    c = concurrent / replicas
    mem_time = (weights + kv_seq * c) / (r * bw)
    compute_time = flops_per_token * c / (r * peak)
    step = max(mem_time, compute_time)
    return replicas * c / step, "memory bandwidth" if mem_time >= compute_time else "compute"


def size_inference(
    arch: Architecture,
    *,
    weight_bytes_per_value: float,
    kv_bytes_per_value: float,
    context: int,
    concurrent: int,
    target_tokens_per_s: float,
    capacity_bytes: float,
    bandwidth_gbps: float,
    bandwidth_efficiency: float,
    peak_tflops: float,
    mfu: float,
    gpus_per_server: int,
    tp: int | None,
    heads_known: bool = True,
) -> InferenceSizing:
    """Replicas of r GPUs each (r a power of two, smallest that holds the weights and one context)
    until fleet memory holds every concurrent sequence's KV cache and decode meets the target."""
    notes: list[str] = []
    weights = arch.parameters * weight_bytes_per_value
    kv_seq = kv_cache_bytes(
        layers=arch.layers,
        kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        bytes_per_value=kv_bytes_per_value,
        tokens=context,
    )
    sizes = [tp] if tp else _powers_of_two(max(gpus_per_server, 1) * 64)
    if heads_known and not tp:  # tensor parallel inside a server, pipeline across servers
        sizes = [
            x
            for x in sizes
            if tp_divides_heads(min(x, gpus_per_server), arch.heads, arch.kv_heads, serving=True)
        ]

    def kv_of(r: int) -> float:  # KV heads replicated when tp exceeds them (vLLM)
        return kv_seq * max(1.0, min(r, gpus_per_server) / arch.kv_heads)

    fitting = [x for x in sizes if x * capacity_bytes >= weights + kv_of(x)]
    in_server = [x for x in fitting if x <= gpus_per_server]
    fitting = in_server or fitting[:1]  # tensor parallelism leaves the server only if it must
    fits = bool(fitting)
    if not fitting:
        fitting = [sizes[-1]]
        notes.append("weights plus one context do not fit in any replica size tried")
    bw = bandwidth_gbps * 1e9 * bandwidth_efficiency
    peak = peak_tflops * 1e12 * mfu
    fpt = 2.0 * arch.parameters

    def decode(r: int, n: int) -> tuple[float, str]:  # n replicas of r GPUs
        return _decode_rate(
            replicas=n,
            r=r,
            weights=weights,
            kv_seq=kv_of(r),
            concurrent=concurrent,
            bw=bw,
            flops_per_token=fpt,
            peak=peak,
        )

    def rate(r: int, n: int) -> float:
        return decode(r, n)[0]

    options: list[tuple[int, int, int]] = []  # (gpus, r, replicas) meeting the target
    fallback: tuple[float, int, int] | None = None  # best rate when nothing meets it
    for r in fitting:
        room = r * capacity_bytes - weights
        lo = max(1, math.ceil(concurrent * kv_of(r) / room - 1e-9)) if room > 0 else concurrent
        lo = min(lo, concurrent)
        hi = concurrent  # at most one sequence per replica
        if rate(r, hi) < target_tokens_per_s:
            if fallback is None or rate(r, hi) > fallback[0]:
                fallback = (rate(r, hi), r, hi)
            continue
        while lo < hi:  # rate rises with replicas: fewer sequences per decode step
            mid = (lo + hi) // 2
            if rate(r, mid) >= target_tokens_per_s:
                hi = mid
            else:
                lo = mid + 1
        options.append((r * lo, r, lo))
    if options:
        _, r, replicas = min(options)
    else:
        assert fallback is not None
        _, r, replicas = fallback
        notes.append(
            f"{concurrent} concurrent sequences cannot reach {target_tokens_per_s:.0f} tokens/s "
            "(each sequence decodes one token per step); raise concurrent_sequences"
        )
    tokens_s, bound = decode(r, replicas)
    n = replicas * r
    servers_gpus = _round_up(n, gpus_per_server) if r <= gpus_per_server else n
    per_gpu = (weights + kv_of(r) * concurrent / replicas) / r
    return InferenceSizing(
        gpus=_round_up(servers_gpus, gpus_per_server),
        replicas=replicas,
        gpus_per_replica=r,
        weights_bytes=weights,
        kv_bytes_per_sequence=kv_seq,
        memory_per_gpu_bytes=per_gpu,
        decode_tokens_per_s=tokens_s,
        decode_bound=bound,
        prefill_tokens_per_s=n * peak / fpt,
        fits=fits,
        notes=tuple(notes),
        nodes_per_replica=-(-r // max(gpus_per_server, 1)),
    )
