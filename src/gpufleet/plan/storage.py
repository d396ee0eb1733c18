"""Storage sizing: checkpoint size and write bandwidth, dataset read bandwidth, local NVMe.

A checkpoint holds bf16/fp16 weights (2 bytes per parameter) and the fp32 optimizer states of
mixed-precision Adam (12 bytes: master weights, momentum, variance) = 14 bytes per parameter
(Rajbhandari et al. 2020, "ZeRO", section 3.1); gradients are not saved.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHECKPOINT_BYTES_PER_PARAM", "Storage", "plan_storage"]

CHECKPOINT_BYTES_PER_PARAM = 2.0 + 12.0


@dataclass(frozen=True)
class Storage:
    """Shared and local storage needs of the plan's training workloads (zero when none)."""

    checkpoint_bytes: float
    checkpoint_time_s: float
    checkpoint_write_bytes_per_s: float
    dataset_read_bytes_per_s: float
    local_nvme_needed_bytes_per_node: float
    local_nvme_catalog_bytes_per_node: int | None
    parallel_fs_recommended: bool


def plan_storage(
    *,
    parameters: float,
    tokens_per_s: float,
    checkpoint_time_s: float,
    dataset_bytes_per_token: float,
    nodes: int,
    local_nvme_bytes: int | None,
) -> Storage:
    """Checkpoint = 14 B/param written within ``checkpoint_time_s``; dataset read at the planned
    tokens/s x bytes per token; local NVMe for two checkpoint shards per node (the latest and the
    one being written)."""
    ckpt = parameters * CHECKPOINT_BYTES_PER_PARAM
    write = ckpt / checkpoint_time_s if checkpoint_time_s > 0 else 0.0
    read = tokens_per_s * dataset_bytes_per_token
    local = 2 * ckpt / nodes if nodes else 0.0
    return Storage(
        checkpoint_bytes=ckpt,
        checkpoint_time_s=checkpoint_time_s,
        checkpoint_write_bytes_per_s=write,
        dataset_read_bytes_per_s=read,
        local_nvme_needed_bytes_per_node=local,
        local_nvme_catalog_bytes_per_node=local_nvme_bytes,
        parallel_fs_recommended=max(write, read) > 10e9,
    )
