"""Memory per GPU: model states under ZeRO and model parallelism, activations, KV cache.

Sources:
- Model states for mixed-precision Adam, 16 bytes per parameter (2 fp16/bf16 weights, 2 gradients,
  12 optimizer: fp32 master weights, momentum, variance) and their division by ZeRO stage:
  Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models".
- Activation bytes per transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2 (s sequence, b micro-batch, h hidden,
  a heads, t tensor-parallel size); with 1F1B pipelining the first stage holds L layers' worth.
- KV cache: 2 (K and V) x layers x kv_heads x head_dim x bytes x tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.plan.spec import ModelShape

__all__ = [
    "ADAM_BYTES",
    "Architecture",
    "TrainingMemory",
    "activation_bytes_per_layer",
    "kv_cache_bytes",
    "model_state_bytes",
    "resolve_architecture",
    "training_memory",
]


@dataclass(frozen=True)
class AdamBytes:
    """Bytes per parameter for mixed-precision Adam (ZeRO paper, section 3.1)."""

    weights: float = 2.0
    gradients: float = 2.0
    optimizer: float = 12.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


ADAM_BYTES = AdamBytes()


@dataclass(frozen=True)
class Architecture:
    """A resolved transformer shape; ``derived`` says it was inferred from a parameter count."""

    parameters: float
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    derived: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads


def count_parameters(shape: ModelShape) -> float:
    """Parameters of a decoder-only transformer; 12*L*h^2 + V*h for the classic GPT block.

    Per layer: Q and O projections h*h each, K and V h*(kv_heads*head_dim) each, and the MLP
    2*h*f (3*h*f when gated, e.g. SwiGLU); plus the embedding V*h (twice when untied).
    """
    assert shape.layers and shape.hidden_size and shape.heads
    h, L = shape.hidden_size, shape.layers
    kv = shape.kv_heads or shape.heads
    kv_dim = kv * (h // shape.heads)
    ffn = shape.ffn_hidden_size or 4 * h
    mlp = (3 if shape.gated_mlp else 2) * h * ffn
    attn = 2 * h * h + 2 * h * kv_dim
    emb = (shape.vocab_size or 0) * h * (1 if shape.tied_embeddings else 2)
    return float(L * (attn + mlp) + emb)


def resolve_architecture(shape: ModelShape) -> Architecture:
    """The full shape. With only a parameter count, assume N = 12*L*h^2 and h/L = 128 (GPT-3
    175B: h 12288, L 96), h a multiple of 128 and heads of size 128; the plan states this."""
    if shape.layers and shape.hidden_size and shape.heads:
        n = shape.parameters or count_parameters(shape)
        return Architecture(
            parameters=n,
            layers=shape.layers,
            hidden_size=shape.hidden_size,
            heads=shape.heads,
            kv_heads=shape.kv_heads or shape.heads,
            vocab_size=shape.vocab_size or 0,
            derived=False,
        )
    assert shape.parameters is not None
    n = shape.parameters
    h = max(128, round((n * 128 / 12) ** (1 / 3) / 128) * 128)
    layers = max(1, round(n / (12 * h * h)))
    heads = h // 128
    return Architecture(n, layers, h, heads, heads, 0, derived=True)


def model_state_bytes(
    parameters: float,
    *,
    zero_stage: int,
    tp: int,
    pp: int,
    dp: int,
    bytes_: AdamBytes = ADAM_BYTES,
) -> float:
    """Weights + gradients + optimizer states per GPU.

    Model parallelism (tp x pp) splits every state; ZeRO stage 1 also splits optimizer states over
    the data-parallel group, stage 2 gradients too, stage 3 weights too.
    """
    per_shard = parameters / (tp * pp)
    w = bytes_.weights / (dp if zero_stage >= 3 else 1)
    g = bytes_.gradients / (dp if zero_stage >= 2 else 1)
    o = bytes_.optimizer / (dp if zero_stage >= 1 else 1)
    return per_shard * (w + g + o)


def activation_bytes_per_layer(
    *,
    s: int,
    b: int,
    h: int,
    a: int,
    t: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes stored per transformer layer.

    none, t = 1:            s*b*h*(34 + 5*a*s/h)
    none, tensor parallel:  s*b*h*(10 + 24/t + 5*a*s/(h*t))
    none, + sequence par.:  (s*b*h/t)*(34 + 5*a*s/h)
    selective recompute:    34*s*b*h/t
    full recompute:         2*s*b*h
    """
    sbh = float(s) * b * h
    if recompute == "full":
        return 2.0 * sbh
    if recompute == "selective":
        return 34.0 * sbh / t
    if recompute != "none":
        raise ValueError(f"recompute must be none, selective or full, not {recompute!r}")
    if t == 1:
        return sbh * (34.0 + 5.0 * a * s / h)
    if sequence_parallel:
        return sbh / t * (34.0 + 5.0 * a * s / h)
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def kv_cache_bytes(
    *, layers: int, kv_heads: int, head_dim: int, bytes_per_value: float, tokens: float
) -> float:
    """2 (K and V) x layers x kv_heads x head_dim x bytes x tokens."""
    return 2.0 * layers * kv_heads * head_dim * bytes_per_value * tokens


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per GPU of one training layout, by part."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
        )

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


def training_memory(
    arch: Architecture,
    *,
    seq: int,
    micro_batch: int,
    zero_stage: int,
    tp: int,
    pp: int,
    dp: int,
    sequence_parallel: bool,
    recompute: str,
    capacity_bytes: float,
) -> TrainingMemory:
    """Memory per GPU for a (tp, pp, dp) layout; activations for L layers on the first stage."""
    shard = arch.parameters / (tp * pp)
    act = arch.layers * activation_bytes_per_layer(
        s=seq,
        b=micro_batch,
        h=arch.hidden_size,
        a=arch.heads,
        t=tp,
        sequence_parallel=sequence_parallel and tp > 1,
        recompute=recompute,
    )
    return TrainingMemory(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        weights_bytes=shard * ADAM_BYTES.weights / (dp if zero_stage >= 3 else 1),
        gradients_bytes=shard * ADAM_BYTES.gradients / (dp if zero_stage >= 2 else 1),
        optimizer_bytes=shard * ADAM_BYTES.optimizer / (dp if zero_stage >= 1 else 1),
        activations_bytes=act,
        capacity_bytes=capacity_bytes,
    )


def min_data_parallel(arch: Architecture, zero_stage: int, m1: TrainingMemory) -> int | None:
    """Smallest data-parallel degree at which the layout whose memory at dp = 1 is ``m1`` fits in
    its ``capacity_bytes``; None if never.

    Memory is A + B/d (B the ZeRO-sharded states), so d >= B / (capacity - A).
    """
    capacity_bytes = m1.capacity_bytes
    shard = arch.parameters / (m1.tensor_parallel * m1.pipeline_parallel)
    sharded_per_param = (
        (ADAM_BYTES.weights if zero_stage >= 3 else 0.0)
        + (ADAM_BYTES.gradients if zero_stage >= 2 else 0.0)
        + (ADAM_BYTES.optimizer if zero_stage >= 1 else 0.0)
    )
    b = shard * sharded_per_param
    a = m1.total_bytes - b
    if a >= capacity_bytes:
        return None
    if b == 0:
        return 1
    return max(1, math.ceil(b / (capacity_bytes - a) - 1e-9))
