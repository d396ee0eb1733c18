"""One Slurm node's shape (:class:`NodeSpec`), shared by the config generator
(`config_gen`) and the readers of a node's CPU facts (`node_facts`)."""

from __future__ import annotations

from dataclasses import dataclass

# gpufleet's margin under a catalog system's installed memory (module docstring, RealMemory)
CATALOG_MEMORY_FRACTION = 0.95


@dataclass(frozen=True)
class NodeSpec:
    """One Slurm node: its GPUs by GRES type, and optional daemon placement overrides."""

    name: str
    gpus: tuple[tuple[str, int], ...]  # (gres type, count), e.g. (("h100", 8),)
    cpus: int | None = None
    real_memory_mb: int | None = None
    hostname: str | None = None
    addr: str | None = None
    port: int | None = None
    gpu_files: tuple[str, ...] = ()  # device paths, same order as the GPUs of ``gpus``
    # CPU topology as slurmd reports it (``slurmd -C``); all four or none are written
    boards: int | None = None
    sockets_per_board: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    features: tuple[str, ...] = ()  # e.g. ("h100", "nvidia_550.54.15")
    # per GPU (same order as ``gpus``), the logical core indexes it is close to; () unknown
    gpu_cores: tuple[tuple[int, ...], ...] = ()
    figures_from: str | None = None  # CPU topology and memory: "inventory", "catalog", None

    @property
    def gpu_count(self) -> int:
        return sum(n for _, n in self.gpus)
