"""Storage sizing: checkpoints and datasets on shared storage, local NVMe, when a parallel FS.

The storage need follows each workload:

- Training writes checkpoints: bf16/fp16 weights (2 bytes per parameter) and the fp32 optimizer
  states of mixed-precision Adam (12 bytes: master weights, momentum, variance) = 14 bytes per
  parameter (Rajbhandari et al. 2020, "ZeRO", section 3.1; gradients are not saved), within
  ``checkpoint_time``; it reads its dataset at tokens/s x bytes per token.
- HPC and rendering read their input from shared storage at the start of a run: a simulation's
  mesh and initial/restart state (by default its working set in GPU memory, each rank its
  partition), a render's scene and textures (``dataset_per_node``: every node loads all of it),
  within ``read_time``: read = dataset (x nodes when per node) / read time.
- Inference reads its weights once at start-up; no sustained shared-storage traffic is planned.

A parallel file system (Lustre, GPFS/Storage Scale, WEKA, VAST, ...) is recommended when a
workload spans more than one node and shares data through storage (every training rank writes
its shard of one checkpoint into one namespace at the same moment and every node reads the same
dataset; every node of a simulation or render reads its input at once), which a node's local NVMe
cannot serve to the others (NVIDIA DGX SuperPOD reference architectures pair every SU with a
high-performance shared file system on the storage fabric for this reason), or when the
bandwidth needed passes 10 GB/s (beyond a single NFS server's reach), on one node too.
Capacity = checkpoints kept x checkpoint + datasets (given, or tokens x bytes per token; HPC
inputs once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CHECKPOINT_BYTES_PER_PARAM",
    "PFS_BANDWIDTH_BYTES_S",
    "HpcIo",
    "Storage",
    "WorkloadIo",
    "hpc_io",
    "plan_storage",
]

CHECKPOINT_BYTES_PER_PARAM = 2.0 + 12.0
PFS_BANDWIDTH_BYTES_S = 10e9


@dataclass(frozen=True)
class HpcIo:
    """What one HPC/rendering workload reads from shared storage (``dataset_bytes`` None when
    neither the dataset nor the working set is known)."""

    name: str
    nodes: int
    dataset_bytes: float | None
    read_time_s: float
    per_node: bool = False


@dataclass(frozen=True)
class WorkloadIo:
    """One workload's shared-storage traffic: read/write bandwidth (None when not known) and
    whether it alone needs a parallel file system, with the reason."""

    name: str
    kind: str
    nodes: int
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None
    parallel_fs: bool
    reason: str


@dataclass(frozen=True)
class Storage:
    """Shared and local storage needs of the plan's workloads (zero when none)."""

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
    workloads: tuple[WorkloadIo, ...] = ()
    hpc_read_bytes_per_s: float | None = None


def hpc_io(io: HpcIo) -> WorkloadIo:
    """Read bandwidth = dataset (x nodes when every node reads all of it) / read time; a parallel
    FS when the workload spans nodes with a dataset to read, or reads above 10 GB/s."""
    if io.dataset_bytes is None:
        return WorkloadIo(
            io.name,
            "hpc",
            io.nodes,
            None,
            None,
            False,
            f"{io.name}: dataset unknown (give dataset, memory or values): read bandwidth not "
            "planned",
        )
    total = io.dataset_bytes * (io.nodes if io.per_node else 1)
    read = total / io.read_time_s
    how = (
        f"{io.nodes} nodes x {io.dataset_bytes / 1e12:,.2f} TB each"
        if io.per_node
        else f"{io.dataset_bytes / 1e12:,.2f} TB split over {io.nodes} node(s)"
    )
    rate = f"reads {how} in {io.read_time_s:g} s = {read / 1e9:,.1f} GB/s"
    if io.nodes > 1:
        pfs = True
        why = f"{io.name} spans {io.nodes} nodes and {rate}: every node reads its input from one "
        why += "shared namespace at once"
    else:
        pfs = read > PFS_BANDWIDTH_BYTES_S
        limit = "above" if pfs else "within"
        why = f"{io.name} {rate}, {limit} one NFS server (10 GB/s)"
    return WorkloadIo(io.name, "hpc", io.nodes, read, None, pfs, why)


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
    hpc: Sequence[HpcIo] = (),
) -> Storage:
    """Checkpoint = 14 B/param written within ``checkpoint_time_s``; dataset read at the planned
    tokens/s x bytes per token; local NVMe for two checkpoint shards per node (the latest and the
    one being written); a parallel FS for multi-node training or above 10 GB/s; HPC inputs as
    :func:`hpc_io` says."""
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
        reason = "no training or HPC workload: no checkpoint or dataset traffic planned"
    ios = [hpc_io(h) for h in hpc]
    if ckpt:
        ios.insert(
            0,
            WorkloadIo("training", "training", training_nodes, read, write, multi or fast, reason),
        )
    hpc_reads = [i.read_bytes_per_s for i in ios if i.kind == "hpc" and i.read_bytes_per_s]
    hpc_read = sum(hpc_reads) if hpc_reads else None
    needs = [i for i in ios if i.parallel_fs]
    unknown = [i for i in ios if i.kind == "hpc" and i.read_bytes_per_s is None]
    pfs = bool(needs)
    if ios and not ckpt:
        reason = "; ".join(i.reason for i in (needs + unknown if needs else ios))
    elif ckpt and any(i.kind == "hpc" for i in needs + unknown):
        reason = "; ".join(i.reason for i in needs + unknown)
    hpc_data = sum(h.dataset_bytes for h in hpc if h.dataset_bytes is not None)
    return Storage(
        checkpoint_bytes=ckpt,
        checkpoint_time_s=checkpoint_time_s,
        checkpoint_write_bytes_per_s=write,
        dataset_read_bytes_per_s=read + (hpc_read or 0.0),
        local_nvme_needed_bytes_per_node=local,
        local_nvme_catalog_bytes_per_node=local_nvme_bytes,
        parallel_fs_recommended=pfs or multi or fast,
        reason=reason,
        checkpoints_kept=checkpoints_kept,
        dataset_bytes=data + hpc_data,
        capacity_bytes=checkpoints_kept * ckpt + data + hpc_data,
        workloads=tuple(ios),
        hpc_read_bytes_per_s=hpc_read,
    )
