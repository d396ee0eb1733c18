"""Sizing one workload on one candidate server: training, inference, HPC or a plain GPU count.

Dispatches to ``compute`` (training, inference) and ``hpc``; checks tensor-parallel sizes against
the attention heads (an explicit size that does not divide them is refused naming the field; a
bare parameter count leaves them unknown and the plan says so). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog import Catalog
from gpufleet.errors import ConfigError, UsageError
from gpufleet.plan.compute import (
    InferenceSizing,
    TrainingSizing,
    size_inference,
    size_training,
    tp_divides_heads,
)
from gpufleet.plan.hardware import Server
from gpufleet.plan.hpc import HpcSizing, size_hpc
from gpufleet.plan.memory import Architecture, resolve_architecture
from gpufleet.plan.spec import (
    BYTES_PER_VALUE,
    GpuCountWorkload,
    HpcWorkload,
    InferenceWorkload,
    TrainingWorkload,
)

__all__ = ["WorkloadPlan", "size_workload"]

# Precision used for the compute peak when weights are stored as integers.
_COMPUTE_PRECISION = {"int8": "fp8", "int4": "fp4", "fp32": "tf32"}


@dataclass(frozen=True)
class WorkloadPlan:
    """One workload sized on one candidate."""

    name: str
    kind: str
    gpus: int
    architecture: Architecture | None
    training: TrainingSizing | None
    inference: InferenceSizing | None
    hpc: HpcSizing | None = None
    notes: tuple[str, ...] = ()


def _tp_check(
    w: TrainingWorkload | InferenceWorkload, index: int, arch: Architecture, serving: bool
) -> list[str]:
    """Refuse an explicit tensor-parallel size that does not split the heads; say when the
    heads are unknown (only a parameter count given) so nothing could be checked."""
    tp = w.tensor_parallel
    if arch.derived:
        what = f"tensor_parallel {tp}" if isinstance(tp, int) else "the tensor-parallel size"
        return [
            f"{what} could not be checked against the attention heads: the model gives only a "
            "parameter count (add layers, hidden_size, heads and kv_heads to check it)"
        ]
    if isinstance(tp, int) and not tp_divides_heads(tp, arch.heads, arch.kv_heads, serving=serving):
        ok = [
            t
            for t in range(1, min(arch.heads, 64) + 1)
            if tp_divides_heads(t, arch.heads, arch.kv_heads, serving=serving)
        ]
        raise ConfigError(
            f"workloads[{index}].tensor_parallel: {tp} does not divide the {arch.heads} "
            f"attention heads and {arch.kv_heads} KV heads",
            hint=f"choose one of {', '.join(map(str, ok))} or 'auto'",
        )
    return []


def _size_hpc(w: HpcWorkload, server: Server, catalog: Catalog, headroom: float) -> WorkloadPlan:
    gpu = catalog.gpus[server.gpu_key]
    path = "fp64_tensor" if w.precision == "fp64" and w.tensor_cores else w.precision
    peak = gpu.tflops.get(path) or gpu.tflops.get(w.precision)
    if not peak:
        raise UsageError(
            f"{gpu.marketing_name} has no {w.precision} peak in the catalog",
            hint="choose a candidate with FP64 units (H100/H200/B200/A100/MI300X)",
        )
    if not gpu.tflops.get(path):
        path = w.precision
    ws = (
        w.memory
        if w.memory is not None
        else (w.values * BYTES_PER_VALUE[w.precision] if w.values is not None else None)
    )
    hs = size_hpc(
        precision=w.precision,
        peak_path=path,
        peak_tflops=peak,
        efficiency=w.efficiency,
        rate_tflops=w.sustained_tflops,
        flops=w.flops,
        target_days=w.target_days,
        working_set_bytes=ws,
        capacity_bytes=server.gpu_memory_bytes * (1 - headroom),
        gpus=w.gpus,
        gpus_per_server=server.gpus,
    )
    return WorkloadPlan(w.name, w.kind, hs.gpus, None, None, None, hs, hs.notes)


def size_workload(
    w: TrainingWorkload | InferenceWorkload | HpcWorkload | GpuCountWorkload,
    server: Server,
    catalog: Catalog,
    headroom: float,
    index: int = 0,
) -> WorkloadPlan:
    """Size ``w`` (the spec's workload number ``index``) on ``server``."""
    gpu = catalog.gpus[server.gpu_key]
    cap = server.gpu_memory_bytes * (1 - headroom)
    if isinstance(w, GpuCountWorkload):
        n = -(-w.gpus // server.gpus) * server.gpus
        return WorkloadPlan(w.name, w.kind, n, None, None, None)
    if isinstance(w, HpcWorkload):
        return _size_hpc(w, server, catalog, headroom)
    arch = resolve_architecture(w.model)
    tp_notes = tuple(_tp_check(w, index, arch, isinstance(w, InferenceWorkload)))
    if isinstance(w, TrainingWorkload):
        peak = gpu.tflops.get(w.precision)
        if not peak:
            raise UsageError(
                f"{gpu.marketing_name} has no {w.precision} tensor-core peak in the catalog",
                hint="choose another precision or candidate",
            )
        tr = size_training(
            arch,
            tokens=w.tokens,
            seq=w.sequence_length,
            global_batch=w.global_batch,
            micro_batch=w.micro_batch,
            zero_stage=w.zero_stage,
            tp=None if w.tensor_parallel == "auto" else w.tensor_parallel,
            pp=None if w.pipeline_parallel == "auto" else w.pipeline_parallel,
            dp=None if w.data_parallel == "auto" else w.data_parallel,
            sequence_parallel=w.sequence_parallel,
            recompute=w.recompute,
            capacity_bytes=cap,
            peak_tflops=peak,
            mfu=w.mfu,
            target_days=w.target_days,
            gpus=w.gpus,
            gpus_per_server=server.gpus,
            heads_known=not arch.derived,
        )
        return WorkloadPlan(w.name, w.kind, tr.gpus, arch, tr, None, None, tp_notes)
    prec = _COMPUTE_PRECISION.get(w.weights_precision, w.weights_precision)
    peak = gpu.tflops.get(prec) or gpu.tflops.get("fp16") or gpu.tflops.get("bf16")
    if not peak:
        raise UsageError(f"{gpu.marketing_name} has no tensor-core peak for {prec} in the catalog")
    inf = size_inference(
        arch,
        weight_bytes_per_value=BYTES_PER_VALUE[w.weights_precision],
        kv_bytes_per_value=BYTES_PER_VALUE[w.kv_cache_precision],
        context=w.context_length,
        concurrent=w.concurrent_sequences,
        target_tokens_per_s=w.target_tokens_per_s,
        capacity_bytes=cap,
        bandwidth_gbps=server.gpu_bandwidth_gbps,
        bandwidth_efficiency=w.bandwidth_efficiency,
        peak_tflops=peak,
        mfu=w.mfu,
        gpus_per_server=server.gpus,
        tp=None if w.tensor_parallel == "auto" else w.tensor_parallel,
        heads_known=not arch.derived,
    )
    return WorkloadPlan(w.name, w.kind, inf.gpus, arch, None, inf, None, tp_notes)
