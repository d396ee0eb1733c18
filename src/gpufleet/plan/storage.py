"""Storage sizing: checkpoints and datasets on shared storage, local NVMe, when a parallel FS.

A checkpoint holds bf16/fp16 weights (2 bytes per parameter) and the fp32 optimizer states of
mixed-precision Adam (12 bytes: master weights, momentum, variance) = 14 bytes per parameter
(Rajbhandari et al. 2020, "ZeRO", section 3.1); gradients are not saved.

A parallel file system (Lustre, GPFS/Storage Scale, WEKA, VAST, ...) is recommended when training
spans more than one node: every rank writes its shard of one checkpoint into one namespace at the
same moment and every node reads the same dataset, which a node's local NVMe cannot serve to the
others (NVIDIA DGX SuperPOD reference architectures pair every SU with a high-performance shared
file system on the storage fabric for this reason), or when the bandwidth needed passes 10 GB/s
(beyond a single NFS server's reach). Capacity = checkpoints kept x checkpoint + dataset (given,
or tokens x bytes per token).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHECKPOINT_BYTES_PER_PARAM", "PFS_BANDWIDTH_BYTES_S", "Storage", "plan_storage"]

CHECKPOINT_BYTES_PER_PARAM = 2.0 + 12.0
PFS_BANDWIDTH_BYTES_S = 10e9


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
    reason: str
    checkpoints_kept: int
    dataset_bytes: float
    capacity_bytes: float


def plan_storage(
    *,
    parameters: float,
    tokens_per_s: float,
    checkpoint_time_s: float,
    dataset_bytes_per_token: float,
    nodes: int,
    local_nvme_bytes: int | None,
    training_nodes: int = 0,
    tokens: float = 0.0,
    checkpoints_kept: int = 3,
    dataset_bytes: float | None = None,
) -> Storage:
    """Checkpoint = 14 B/param written within ``checkpoint_time_s``; dataset read at the planned
    tokens/s x bytes per token; local NVMe for two checkpoint shards per node (the latest and the
    one being written); a parallel FS for multi-node training or above 10 GB/s."""
    ckpt = parameters * CHECKPOINT_BYTES_PER_PARAM
    write = ckpt / checkpoint_time_s if checkpoint_time_s > 0 else 0.0
    read = tokens_per_s * dataset_bytes_per_token
    local = 2 * ckpt / nodes if nodes else 0.0
    data = dataset_bytes if dataset_bytes is not None else tokens * dataset_bytes_per_token
    fast = max(write, read) > PFS_BANDWIDTH_BYTES_S
    multi = training_nodes > 1
    if multi:
        reason = (
            f"training spans {training_nodes} nodes: checkpoint shards and the dataset must be "
            "in one shared namespace at full speed"
        )
    elif fast:
        reason = f"bandwidth {max(write, read) / 1e9:.1f} GB/s is above one NFS server (10 GB/s)"
    elif ckpt:
        reason = "single-node training: local NVMe and an NFS share suffice"
    else:
        reason = "no training workload: no checkpoint traffic"
    return Storage(
        checkpoint_bytes=ckpt,
        checkpoint_time_s=checkpoint_time_s,
        checkpoint_write_bytes_per_s=write,
        dataset_read_bytes_per_s=read,
        local_nvme_needed_bytes_per_node=local,
        local_nvme_catalog_bytes_per_node=local_nvme_bytes,
        parallel_fs_recommended=multi or fast,
        reason=reason,
        checkpoints_kept=checkpoints_kept,
        dataset_bytes=data,
        capacity_bytes=checkpoints_kept * ckpt + data,
    )
