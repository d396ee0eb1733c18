"""Placement: best fit on free GPUs, topology-aware.

A job asks for ``spec.gpus`` GPUs on each of ``spec.nodes`` nodes (Slurm's meaning of
``--nodes`` with ``--gres=gpu:N``: the GPU count is per node). Only GPUs that match the job's
model and minimum memory count, and only on nodes that serve the job's tenant (its own, or
shared nodes of no tenant).

- One node: the candidate with the fewest matching free GPUs that still fits (best fit, so big
  holes stay free for big jobs); ties go to the lower node name.
- Several nodes: all of them from one NVLink domain when possible, else one leaf switch, else one
  rack, else anywhere; inside the tightest scope that fits, the group and nodes that leave the
  fewest free GPUs behind.
- Inside a node, the lowest free indexes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.catalog import load_catalog
from gpufleet.errors import UnknownNameError, UsageError
from gpufleet.schedulers.base import JobSpec

# Topology scopes for multi-node jobs, tightest first.
SCOPES = ("nvlink_domain", "leaf_switch", "rack")


@dataclass(frozen=True)
class GpuSlot:
    """One schedulable GPU of a node."""

    index: int
    model: str  # catalog key
    memory_bytes: int


@dataclass(frozen=True)
class NodeInfo:
    """A node the embedded scheduler can place work on, with what it knows of its topology."""

    name: str
    gpus: tuple[GpuSlot, ...]
    nvlink_domain: str | None = None  # GPUs of several nodes on one NVLink fabric (NVL72)
    leaf_switch: str | None = None
    rack: str | None = None
    tenant: str | None = None  # None: a shared node, open to every tenant's jobs

    def serves(self, tenant: str) -> bool:
        """May a job of ``tenant`` run here (its tenant's node, or a shared one)?"""
        return self.tenant is None or self.tenant == tenant

    def scope(self, name: str) -> str | None:
        value: str | None = getattr(self, name)
        return value


@dataclass(frozen=True)
class Placement:
    """Where a job goes: per node, the GPU indexes it gets."""

    nodes: tuple[str, ...]
    gpus: tuple[tuple[int, ...], ...]
    scope: str  # "node", "nvlink_domain", "leaf_switch", "rack" or "any"


def normalize_model(name: str) -> str:
    """A catalog key for a user's GPU model name (aliases accepted); did-you-mean on a miss."""
    cat = load_catalog()
    model = cat.find_gpu(name)
    if model is None:
        raise UnknownNameError("GPU model", name, sorted(cat.gpus))
    return model.key


def matching(node: NodeInfo, spec: JobSpec, model_key: str | None) -> list[GpuSlot]:
    """The GPUs of ``node`` that satisfy the job's model and memory constraints."""
    out = []
    for g in node.gpus:
        if model_key is not None and g.model != model_key:
            continue
        if spec.min_gpu_memory_bytes is not None and g.memory_bytes < spec.min_gpu_memory_bytes:
            continue
        out.append(g)
    return out


def check_feasible(spec: JobSpec, nodes: Iterable[NodeInfo]) -> None:
    """Raise a clear UsageError when no allocation of this inventory could ever run ``spec``."""
    if spec.gpus < 1:
        raise UsageError(f"job {spec.name!r}: gpus must be at least 1 (got {spec.gpus})")
    if spec.nodes < 1:
        raise UsageError(f"job {spec.name!r}: nodes must be at least 1 (got {spec.nodes})")
    if spec.mig_profile:
        raise UsageError(
            f"job {spec.name!r}: mig_profile is not supported by the embedded scheduler",
            hint="ask for whole GPUs, or use the slurm backend with MIG gres",
        )
    model_key = normalize_model(spec.gpu_model) if spec.gpu_model else None
    nodes = [n for n in nodes if n.serves(spec.tenant)]
    able = [n for n in nodes if len(matching(n, spec, model_key)) >= spec.gpus]
    if len(able) < spec.nodes:
        what = f"{spec.gpus} GPU(s)"
        if model_key:
            what += f" of model {model_key}"
        if spec.min_gpu_memory_bytes:
            what += f" with at least {spec.min_gpu_memory_bytes / 2**30:.0f} GiB"
        raise UsageError(
            f"job {spec.name!r}: needs {spec.nodes} node(s) with {what} each; "
            f"only {len(able)} of {len(nodes)} node(s) have that",
        )


def place(
    spec: JobSpec,
    nodes: Iterable[NodeInfo],
    used: Mapping[str, Iterable[int]],
    exclude: Iterable[str] = (),
) -> Placement | None:
    """Choose nodes and GPUs for ``spec`` among schedulable ``nodes``; ``None`` if it can't fit now.

    ``used`` maps node name to the GPU indexes already allocated there; ``exclude`` lists nodes
    this job must avoid (where it already met a node fault).
    """
    model_key = normalize_model(spec.gpu_model) if spec.gpu_model else None
    skip = set(exclude)
    free: dict[str, list[int]] = {}
    infos: dict[str, NodeInfo] = {}
    for node in nodes:
        if node.name in skip or not node.serves(spec.tenant):
            continue
        taken = set(used.get(node.name, ()))
        idx = sorted(g.index for g in matching(node, spec, model_key) if g.index not in taken)
        if len(idx) >= spec.gpus:
            free[node.name] = idx
            infos[node.name] = node
    if len(free) < spec.nodes:
        return None
    if spec.nodes == 1:
        best = min(free, key=lambda n: (len(free[n]), n))
        return Placement((best,), (tuple(free[best][: spec.gpus]),), "node")
    for scope in (*SCOPES, "any"):
        groups: dict[str, list[str]] = {}
        for name, info in infos.items():
            key = "*" if scope == "any" else info.scope(scope)
            if key is not None:
                groups.setdefault(key, []).append(name)
        options = []
        for key, members in groups.items():
            if len(members) < spec.nodes:
                continue
            chosen = sorted(members, key=lambda n: (len(free[n]), n))[: spec.nodes]
            leftover = sum(len(free[n]) - spec.gpus for n in chosen)
            options.append((leftover, key, chosen))
        if options:
            _, _, chosen = min(options)
            ordered = tuple(sorted(chosen))
            return Placement(ordered, tuple(tuple(free[n][: spec.gpus]) for n in ordered), scope)
    return None


def nodes_from_sim(
    fleet: object,
    nvlink_domains: Mapping[str, str] | None = None,
    leaf_switches: Mapping[str, str] | None = None,
) -> list[NodeInfo]:
    """NodeInfo for every node of a ``SimFleet`` (rack from its spec; domains/leaves given)."""
    from gpufleet.devices.sim import SimFleet

    assert isinstance(fleet, SimFleet)
    out = []
    for name, node in fleet.nodes.items():
        slots = tuple(GpuSlot(g.index, g.model.key, g.model.memory_bytes) for g in node.gpus)
        out.append(
            NodeInfo(
                name=name,
                gpus=slots,
                nvlink_domain=(nvlink_domains or {}).get(name),
                leaf_switch=(leaf_switches or {}).get(name),
                rack=node.rack,
            )
        )
    return out
