"""What a MIG plan becomes: a mig-parted config, node labels, Slurm gres lines, a table.

- mig-parted (github.com/NVIDIA/mig-parted, "config file" format; also what the GPU Operator's
  MIG manager reads from its ConfigMap key ``config.yaml``): ``version: v1`` and
  ``mig-configs: {name: [{devices, mig-enabled, mig-devices}]}``; ``devices`` is ``all`` or a
  list of GPU indices, ``mig-devices`` maps profile name to instance count.
- Node label ``nvidia.com/mig.config=<name>``: the GPU Operator's MIG manager applies the named
  config to the node it labels (GPU Operator docs, "GPUs with Multi-Instance GPU").
- Slurm: ``gres.conf`` ``AutoDetect=nvml`` finds MIG devices; ``slurm.conf`` names them by
  profile in the node's ``Gres=`` (Slurm gres.html, "MIG Support").
"""

from __future__ import annotations

import hashlib
from typing import Any

from rich.table import Table

from gpufleet.mig.planner import GpuResult, MigPlan

__all__ = [
    "LABEL_KEY",
    "config_name",
    "kubectl_label_commands",
    "mig_parted_config",
    "node_labels",
    "plan_table",
    "slurm_lines",
]

LABEL_KEY = "nvidia.com/mig.config"
DISABLED = "all-disabled"


def _node_entries(results: list[GpuResult]) -> list[dict[str, Any]]:
    """mig-parted entries for one node: GPUs with the same layout share an entry."""
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for r in sorted(results, key=lambda r: r.gpu.index):
        groups.setdefault(r.layout.key, []).append(r.gpu.index)
    entries: list[dict[str, Any]] = []
    every = len(results) == 1 or len(groups) == 1
    for key, indices in groups.items():
        devices: Any = "all" if every else indices
        if key:
            entries.append({"devices": devices, "mig-enabled": True, "mig-devices": dict(key)})
        else:
            entries.append({"devices": devices, "mig-enabled": False})
    return entries


def config_name(entries: list[dict[str, Any]]) -> str:
    """A readable, valid label value (<= 63 chars) naming a node's config."""
    if all(not e["mig-enabled"] for e in entries):
        return DISABLED
    if len(entries) == 1:
        devs = entries[0]["mig-devices"]
        name = "gpufleet-all-" + "-".join(f"{n}x{p}" for p, n in devs.items())
        name = name.replace("+", "plus")
        if len(name) <= 63:
            return name
    digest = hashlib.sha256(repr(entries).encode()).hexdigest()[:10]
    return f"gpufleet-mixed-{digest}"


def _by_node(plan: MigPlan) -> dict[str, list[GpuResult]]:
    out: dict[str, list[GpuResult]] = {}
    for r in plan.gpus:
        out.setdefault(r.gpu.node, []).append(r)
    return out


def mig_parted_config(plan: MigPlan) -> dict[str, Any]:
    """The mig-parted config holding every node's named layout (plus ``all-disabled``)."""
    configs: dict[str, Any] = {DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for results in _by_node(plan).values():
        entries = _node_entries(results)
        configs.setdefault(config_name(entries), entries)
    return {"version": "v1", "mig-configs": configs}


def node_labels(plan: MigPlan) -> dict[str, dict[str, str]]:
    """``{node: {"nvidia.com/mig.config": name}}`` for every node of the plan."""
    return {
        node: {LABEL_KEY: config_name(_node_entries(results))}
        for node, results in _by_node(plan).items()
    }


def kubectl_label_commands(plan: MigPlan) -> list[str]:
    """One ``kubectl label`` per node whose layout changes (drain it first)."""
    out = []
    for node, results in _by_node(plan).items():
        if any(r.repartition for r in results):
            name = config_name(_node_entries(results))
            out.append(f"kubectl label node {node} {LABEL_KEY}={name} --overwrite")
    return out


def slurm_lines(plan: MigPlan) -> dict[str, list[str]]:
    """``slurm.conf`` node lines (``Gres=gpu:<profile>:<n>``) and ``gres.conf`` lines."""
    slurm_conf: list[str] = []
    gres_conf: list[str] = []
    for node, results in _by_node(plan).items():
        counts: dict[str, int] = {}
        for r in results:
            if r.layout.empty:
                key = r.gpu.model
                counts[key] = counts.get(key, 0) + 1
            for p, n in r.layout.counts.items():
                counts[p] = counts.get(p, 0) + n
        gres = ",".join(f"gpu:{t}:{n}" for t, n in counts.items())
        slurm_conf.append(f"NodeName={node} Gres={gres}")
        gres_conf.append(f"NodeName={node} AutoDetect=nvml")
    return {"slurm.conf": slurm_conf, "gres.conf": gres_conf}


def plan_table(plan: MigPlan, title: str | None = None) -> Table:
    """A Rich table: one row per GPU with MIG on (or changing), tenants per instance."""
    t = Table(title=title or f"MIG plan ({plan.method})")
    for col in ("node", "gpu", "model", "layout", "tenants", "stranded", "change"):
        # Identifiers never end in "…" at 80 columns (a tenant name is what matters here).
        t.add_column(col, overflow="fold", no_wrap=col in ("node", "gpu", "model", "change"))
    for r in plan.gpus:
        if r.layout.empty and not r.repartition:
            continue
        tenants = ", ".join(
            f"{a.placement.profile}@{a.placement.start}:{a.tenant or 'spare'}"
            for a in r.assignments
        )
        t.add_row(
            r.gpu.node,
            str(r.gpu.index),
            r.gpu.model,
            r.layout.describe(),
            tenants,
            f"{r.layout.memory_stranded} mem / {r.layout.compute_stranded} sm",
            "re-partition" if r.repartition else "keep",
        )
    return t
