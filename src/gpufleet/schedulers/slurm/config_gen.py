"""Generate Slurm configuration: slurm.conf node/partition lines, gres.conf, topology.conf.

Inputs are a planner result (``gpufleet plan --json``) or an inventory (``gpufleet inventory
--json``), both as plain JSON documents, turned into one :class:`ClusterSpec`.

Sources:
- slurm.conf(5), gres.conf(5), topology.conf(5) of Slurm 22.05 (Debian 12 ``slurm-wlm``):
  ``Gres=gpu:TYPE:COUNT`` on a NodeName line, ``GresTypes=gpu``, ``SelectType=select/cons_tres``
  for GPU scheduling, ``AutoDetect=off`` with ``File=`` device paths (Debian's build has no NVML),
  ``TopologyPlugin=topology/tree`` with ``SwitchName=... Nodes=...|Switches=...`` lines.
- ``ReturnToService=2``: a DOWN node returns to service when it registers with a valid
  configuration (slurm.conf(5)), so a repaired node needs no manual resume.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError
from gpufleet.hostlist import compress

# slurm.conf settings gpufleet relies on (see the module docstring for each one's source).
GPU_SETTINGS: dict[str, str] = {
    "SelectType": "select/cons_tres",
    "SelectTypeParameters": "CR_Core",
    "GresTypes": "gpu",
    "ReturnToService": "2",
}


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

    @property
    def gpu_count(self) -> int:
        return sum(n for _, n in self.gpus)


@dataclass(frozen=True)
class SwitchSpec:
    """One topology.conf switch: it links either nodes (a leaf) or other switches."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes, their partition, and the switch tree over them."""

    nodes: tuple[NodeSpec, ...]
    switches: tuple[SwitchSpec, ...] = ()
    partition: str = "gpu"
    notes: tuple[str, ...] = ()


def gres_type(model: str | None) -> str:
    """The GRES type for a catalog GPU key: its first one-word alias (``h100-sxm`` -> ``h100``).

    Falls back to the key with ``-`` as ``_`` (``a100-sxm4-40gb`` -> ``a100_sxm4_40gb``), so
    types never collide between catalog models.
    """
    if not model:
        return "gpu"
    from gpufleet.catalog import load_catalog

    gpu = load_catalog().gpus.get(model)
    for alias in gpu.aliases if gpu else ():
        if re.fullmatch(r"[a-z0-9]+", alias):
            return alias
    return re.sub(r"[^A-Za-z0-9_]", "_", model)


def _gres(node: NodeSpec) -> str:
    return ",".join(f"gpu:{t}:{n}" for t, n in node.gpus if n > 0)


def _node_key(node: NodeSpec) -> tuple[Any, ...]:
    return (node.gpus, node.cpus, node.real_memory_mb, node.hostname, node.addr)


def node_lines(cluster: ClusterSpec) -> list[str]:
    """``NodeName=`` lines; consecutive nodes with the same shape share one line.

    Nodes with a ``port`` each get their own port; a run of them shares a line with
    ``Port=[a-b]`` when the ports are consecutive (slurm.conf(5), "Port").
    """
    lines: list[str] = []
    run: list[NodeSpec] = []

    def flush() -> None:
        if not run:
            return
        first = run[0]
        parts = [f"NodeName={compress(n.name for n in run)}"]
        if first.hostname:
            parts.append(f"NodeHostname={first.hostname}")
        if first.addr:
            parts.append(f"NodeAddr={first.addr}")
        if first.port is not None:
            lo, hi = first.port, run[-1].port
            parts.append(f"Port={lo}" if lo == hi else f"Port=[{lo}-{hi}]")
        if first.cpus:
            parts.append(f"CPUs={first.cpus}")
        if first.real_memory_mb:
            parts.append(f"RealMemory={first.real_memory_mb}")
        if first.gpu_count:
            parts.append(f"Gres={_gres(first)}")
        parts.append("State=UNKNOWN")
        lines.append(" ".join(parts))
        run.clear()

    for node in cluster.nodes:
        if run:
            prev = run[-1]
            same = _node_key(prev) == _node_key(node)
            ports_ok = (prev.port is None and node.port is None) or (
                prev.port is not None and node.port == prev.port + 1
            )
            if not (same and ports_ok):
                flush()
        run.append(node)
    flush()
    return lines


def partition_lines(cluster: ClusterSpec) -> list[str]:
    """One default partition holding every node."""
    names = compress(n.name for n in cluster.nodes)
    return [
        f"PartitionName={cluster.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP"
    ]


def slurm_conf(
    cluster: ClusterSpec,
    base: Mapping[str, str] | None = None,
    *,
    health_check_program: str | None = None,
    health_check_interval_s: int = 30,
) -> str:
    """slurm.conf text: ``base`` settings (site: daemons, paths), gpufleet's GPU settings,
    the health check, topology plugin, then node and partition lines.

    ``HealthCheckInterval`` of 0 disables the check (slurm.conf(5)); gpufleet installs a
    wrapper (:func:`health_check_wrapper`) because slurmd runs it with an almost empty
    environment.
    """
    settings: dict[str, str] = dict(base or {})
    settings.update({k: v for k, v in GPU_SETTINGS.items() if k not in settings})
    if cluster.switches:
        settings.setdefault("TopologyPlugin", "topology/tree")
    if health_check_program:
        settings["HealthCheckProgram"] = health_check_program
        settings["HealthCheckInterval"] = str(health_check_interval_s)
        settings.setdefault("HealthCheckNodeState", "ANY")
    out = ["# Generated by gpufleet (gpufleet config slurm).", ""]
    out += [f"{k}={v}" for k, v in settings.items()]
    out += ["", "# Nodes", *node_lines(cluster), "", "# Partitions", *partition_lines(cluster)]
    return "\n".join(out) + "\n"


def gres_conf(cluster: ClusterSpec) -> str:
    """gres.conf: ``AutoDetect=off`` and one line per node and GPU type with its device files.

    Without ``File=`` a GPU GRES cannot be bound to devices; nodes without known files get
    ``/dev/nvidia[0-N]`` (the NVIDIA driver's device nodes, one per minor number).
    """
    out = ["# Generated by gpufleet (gpufleet config slurm).", "AutoDetect=off"]
    runs: list[tuple[list[str], tuple[str, ...]]] = []  # nodes sharing identical GRES lines
    for node in cluster.nodes:
        files = list(node.gpu_files)
        tails: list[str] = []
        i = 0
        for gtype, count in node.gpus:
            if count <= 0:
                continue
            mine = (
                files[i : i + count] if files else [f"/dev/nvidia{j}" for j in range(i, i + count)]
            )
            i += count
            tails.append(f"Name=gpu Type={gtype} Count={count} File={_file_list(mine)}")
        if runs and runs[-1][1] == tuple(tails):
            runs[-1][0].append(node.name)
        elif tails:
            runs.append(([node.name], tuple(tails)))
    for names, tails_ in runs:
        out += [f"NodeName={compress(names)} {t}" for t in tails_]
    return "\n".join(out) + "\n"


def _file_list(paths: Sequence[str]) -> str:
    return compress(paths) if all(re.search(r"\d$", p) for p in paths) else ",".join(paths)


def topology_conf(cluster: ClusterSpec) -> str:
    """topology.conf: leaf switches with their nodes, upper switches with their switches."""
    out = ["# Generated by gpufleet (gpufleet config slurm)."]
    for sw in cluster.switches:
        if sw.nodes:
            out.append(f"SwitchName={sw.name} Nodes={compress(sw.nodes)}")
        else:
            out.append(f"SwitchName={sw.name} Switches={compress(sw.switches)}")
    return "\n".join(out) + "\n"


def health_check_wrapper(slurm_conf_path: str, command: Sequence[str]) -> str:
    """A shell script for ``HealthCheckProgram``: slurmd runs it with an almost empty
    environment (no ``SLURM_CONF``, minimal ``PATH``), so it sets both and execs ``command``
    (by default ``gpufleet health --exit-code``)."""
    return (
        "#!/bin/sh\n"
        "# Generated by gpufleet: Slurm HealthCheckProgram wrapper.\n"
        f"export SLURM_CONF={shlex.quote(slurm_conf_path)}\n"
        'export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"\n'
        f"exec {shlex.join(command)}\n"
    )


# --- inputs -------------------------------------------------------------------------------


def from_inventory(doc: Mapping[str, Any], source: str = "inventory") -> ClusterSpec:
    """A cluster from ``gpufleet inventory --json``: one node per inventory node, GPUs typed by
    catalog model; all nodes under one switch (an inventory knows no fabric)."""
    nodes_doc = doc.get("nodes")
    if not isinstance(nodes_doc, list) or not nodes_doc:
        raise ConfigError(f"{source}: 'nodes' must be a non-empty list")
    nodes: list[NodeSpec] = []
    for i, n in enumerate(nodes_doc):
        name = n.get("name") if isinstance(n, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{source}: nodes[{i}].name is missing")
        counts: dict[str, int] = {}
        for g in n.get("gpus") or []:
            t = gres_type(g.get("model"))
            counts[t] = counts.get(t, 0) + 1
        nodes.append(NodeSpec(name=name, gpus=tuple(counts.items())))
    switches = (SwitchSpec("leaf1", nodes=tuple(n.name for n in nodes)),)
    return ClusterSpec(
        tuple(nodes), switches, notes=("inventory has no fabric: every node under one switch",)
    )


def from_plan(doc: Mapping[str, Any], prefix: str = "gpu", source: str = "plan") -> ClusterSpec:
    """A cluster from ``gpufleet plan --json``: the chosen candidate's servers, named
    ``PREFIX001...``, and a switch tree from its compute fabric.

    The compute fabric is rail-optimized (plan/fabric.py): each group of radix/2 servers
    shares one leaf per rail. Slurm's tree plugin wants each node under one leaf, so a group
    becomes one leaf switch (standing for its rail leaves); two levels put one spine switch
    above all leaves; three levels put a spine per pod (radix/2 leaves) and one core above.
    """
    chosen = doc.get("chosen")
    cands = doc.get("candidates")
    if not isinstance(cands, list):
        raise ConfigError(f"{source}: 'candidates' is missing (is this gpufleet plan --json?)")
    cand = next((c for c in cands if c.get("candidate") == chosen), None)
    if cand is None:
        raise ConfigError(f"{source}: chosen candidate {chosen!r} is not among 'candidates'")
    try:
        server = cand["server"]
        servers = int(cand["servers"])
        per = int(server["gpus"])
        gtype = gres_type(server.get("gpu_key"))
        compute = (cand.get("fabric") or {}).get("compute") or {}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: candidate {chosen!r}: missing field {exc}") from exc
    width = max(3, len(str(servers)))
    names = [f"{prefix}{i:0{width}d}" for i in range(1, servers + 1)]
    nodes = tuple(NodeSpec(name=n, gpus=((gtype, per),)) for n in names)
    return ClusterSpec(nodes, _plan_switches(names, compute))


def _plan_switches(names: list[str], compute: Mapping[str, Any]) -> tuple[SwitchSpec, ...]:
    levels = int(compute.get("levels") or 1)
    radix = int(compute.get("radix") or 64)
    if levels <= 1 or len(names) <= 1:
        return (SwitchSpec("leaf1", nodes=tuple(names)),)
    half = max(1, radix // 2)
    groups = [names[i : i + half] for i in range(0, len(names), half)]
    width = len(str(len(groups)))
    leaves = [SwitchSpec(f"leaf{i + 1:0{width}d}", nodes=tuple(g)) for i, g in enumerate(groups)]
    if levels == 2:
        return (*leaves, SwitchSpec("spine1", switches=tuple(s.name for s in leaves)))
    pods = math.ceil(len(leaves) / half)
    pw = len(str(pods))
    spines = [
        SwitchSpec(
            f"spine{p + 1:0{pw}d}",
            switches=tuple(s.name for s in leaves[p * half : (p + 1) * half]),
        )
        for p in range(pods)
    ]
    return (*leaves, *spines, SwitchSpec("core1", switches=tuple(s.name for s in spines)))


def on_loopback(
    cluster: ClusterSpec, base_port: int, dev_dir: Path, cpus: int = 1, memory_mb: int = 1000
) -> ClusterSpec:
    """The same cluster placed on this host for testing: every node at 127.0.0.1 on its own
    port, its GPUs backed by fake device files under ``dev_dir`` (made by devcluster)."""
    nodes = []
    for i, n in enumerate(cluster.nodes):
        files = tuple(str(dev_dir / f"nvidia{j}") for j in range(n.gpu_count))
        nodes.append(
            replace(
                n,
                hostname="localhost",
                addr="127.0.0.1",
                port=base_port + i,
                cpus=cpus,
                real_memory_mb=memory_mb,
                gpu_files=files,
            )
        )
    return replace(cluster, nodes=tuple(nodes))
