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
- ``RealMemory``: "Nodes which register to the system with less than the configured resources
  (e.g. too little memory), will be placed in the DOWN state" (slurm.conf(5), node
  configuration). An inventory's figure is MemTotal, what ``slurmd -C`` reports; a catalog
  system's is its installed memory, which the OS never fully reports (an HGX H100 with 2 TiB
  shows a MemTotal of 2,063,879 MiB, 98.4%: tests/fixtures/readiness/hgx-h100/proc/meminfo),
  so gpufleet writes :data:`CATALOG_MEMORY_FRACTION` of it. Memory kept for the OS and
  daemons is ``MemSpecLimit``, which works only with memory as a consumable resource
  (slurm.conf(5), MemSpecLimit and RealMemory): the generated file says so in a comment.
- gres.conf ``Cores=``: Slurm's logical core indexes, "Core 0 will be the first core on the
  first socket, while core 1 will be the second core on the first socket" (gres.conf(5),
  Cores), so socket ``s`` of ``c`` cores per socket is ``s*c`` to ``s*c+c-1``.
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
from gpufleet.schedulers.slurm.node_spec import CATALOG_MEMORY_FRACTION, NodeSpec

# slurm.conf settings gpufleet relies on (see the module docstring for each one's source).
GPU_SETTINGS: dict[str, str] = {
    "SelectType": "select/cons_tres",
    "SelectTypeParameters": "CR_Core",
    "GresTypes": "gpu",
    "ReturnToService": "2",
}


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
    return (
        node.gpus,
        node.cpus,
        node.real_memory_mb,
        node.hostname,
        node.addr,
        _topology(node),
        node.features,
        node.gpu_cores,
        node.figures_from,
    )


def _topology(node: NodeSpec) -> tuple[int, int, int, int] | None:
    """Boards, sockets per board, cores per socket, threads per core: all known, else None."""
    parts = (node.boards, node.sockets_per_board, node.cores_per_socket, node.threads_per_core)
    if any(p is None or p < 1 for p in parts):
        return None
    b, s, c, t = (int(p or 0) for p in parts)
    return b, s, c, t


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
        topo = _topology(first)
        if topo:
            b, s, c, t = topo
            parts += [f"Boards={b}", f"SocketsPerBoard={s}", f"CoresPerSocket={c}"]
            parts.append(f"ThreadsPerCore={t}")
        if first.real_memory_mb:
            parts.append(f"RealMemory={first.real_memory_mb}")
        if first.gpu_count:
            parts.append(f"Gres={_gres(first)}")
        if first.features:
            parts.append(f"Features={','.join(first.features)}")
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
    out += ["", "# Nodes", *node_comments(cluster), *node_lines(cluster)]
    out += ["", "# Partitions", *partition_lines(cluster)]
    return "\n".join(out) + "\n"


def node_comments(cluster: ClusterSpec) -> list[str]:
    """Comment lines saying where the node figures come from, and which are left out."""
    out: list[str] = []
    missing: dict[str, list[str]] = {}
    for n in cluster.nodes:
        gaps = [] if _topology(n) else ["CPU topology"]
        gaps += [] if n.real_memory_mb else ["RealMemory"]
        if gaps:
            missing.setdefault(" and ".join(gaps), []).append(n.name)
    for what, names in missing.items():
        out.append(
            f"# {compress(names)}: {what} unknown (no catalog figures for the system, no "
            "inventory 'host'): left out, not guessed; take them from `slurmd -C` on a node"
        )
    catalog = [n.name for n in cluster.nodes if n.figures_from == "catalog"]
    if catalog:
        out.append(
            f"# {compress(catalog)}: CPU topology and RealMemory from the catalog's system; "
            f"RealMemory is {CATALOG_MEMORY_FRACTION:.0%} of its installed memory, as the OS "
            "reports less. A node registering with less than configured is set DOWN "
            "(slurm.conf(5)): check `slurmd -C` on one node (Hyper-Threading off halves CPUs)"
        )
    if any(n.real_memory_mb for n in cluster.nodes):
        out.append(
            "# Memory for the OS and slurmd: add MemSpecLimit=<MiB> to the NodeName lines with "
            "SelectTypeParameters=CR_Core_Memory (slurm.conf(5), MemSpecLimit)"
        )
    return out


def gres_conf(cluster: ClusterSpec) -> str:
    """gres.conf: ``AutoDetect=off`` and one line per node and GPU type with its device files.

    Without ``File=`` a GPU GRES cannot be bound to devices; nodes without known files get
    ``/dev/nvidia[0-N]`` (the NVIDIA driver's device nodes, one per minor number).
    """
    out = ["# Generated by gpufleet (gpufleet config slurm).", "AutoDetect=off"]
    runs: list[tuple[list[str], tuple[str, ...]]] = []  # nodes sharing identical GRES lines
    unbound: list[str] = []
    for node in cluster.nodes:
        files = list(node.gpu_files)
        known = len(node.gpu_cores) == node.gpu_count and all(node.gpu_cores)
        if node.gpu_count and not known:
            unbound.append(node.name)
        tails: list[str] = []
        i = 0
        for gtype, count in node.gpus:
            if count <= 0:
                continue
            mine = (
                files[i : i + count] if files else [f"/dev/nvidia{j}" for j in range(i, i + count)]
            )
            cores = list(node.gpu_cores[i : i + count]) if known else [()] * count
            i += count
            j = 0
            while j < count:  # consecutive GPUs close to the same cores share a line
                k = j + 1
                while k < count and cores[k] == cores[j]:
                    k += 1
                tail = f"Name=gpu Type={gtype} Count={k - j} File={_file_list(mine[j:k])}"
                tails.append(tail + (f" Cores={_ranges(cores[j])}" if cores[j] else ""))
                j = k
        if runs and runs[-1][1] == tuple(tails):
            runs[-1][0].append(node.name)
        elif tails:
            runs.append(([node.name], tuple(tails)))
    if unbound:
        out.append(
            f"# {compress(unbound)}: GPU-to-CPU affinity unknown: Cores= left out (any core may "
            "be allocated with their GPUs: gres.conf(5), Cores)"
        )
    for names, tails_ in runs:
        out += [f"NodeName={compress(names)} {t}" for t in tails_]
    return "\n".join(out) + "\n"


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (gres.conf(5) Cores: a list or ``-`` ranges)."""
    out: list[str] = []
    nums = sorted(set(values))
    start = prev = nums[0]
    for v in [*nums[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


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


def health_check_command(
    *,
    gpufleet: str = "gpufleet",
    controller: str | None = None,
    token_file: str | None = None,
    max_drained: str | None = None,
    duration_s: float = 1.0,
) -> list[str]:
    """The check slurmd should run: ``gpufleet health --exit-code --slurm-drain`` (slurmd ignores
    the exit code, so the check drains and resumes the node itself: docs/slurm.md), asking the
    controller's circuit breaker when one is given, else limited by ``--max-drained``. A short
    sample keeps the whole check within 10 s even with hung GPUs (5 s NVML deadline)."""
    cmd = [gpufleet, "health", "--exit-code", "--slurm-drain", "--duration", f"{duration_s:g}"]
    if controller:
        if not token_file:
            raise ConfigError("a health check asking a controller needs its token file")
        cmd += ["--controller", controller, "--token-file", token_file]
    elif max_drained:
        cmd += ["--max-drained", max_drained]
    return cmd


def health_check_wrapper(
    slurm_conf_path: str, command: Sequence[str], log_path: str | None = None
) -> str:
    """A shell script for ``HealthCheckProgram``: slurmd runs it with an almost empty
    environment (no ``SLURM_CONF``, minimal ``PATH``), so it sets both and execs ``command``
    (:func:`health_check_command`). slurmd keeps none of the program's output: with
    ``log_path`` the check's decisions (stderr, one timestamped line each) are appended there,
    in a 0600 file."""
    lines = [
        "#!/bin/sh",
        "# Generated by gpufleet: Slurm HealthCheckProgram wrapper.",
        f"export SLURM_CONF={shlex.quote(slurm_conf_path)}",
        'export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"',
    ]
    if log_path:
        log_dir = str(Path(log_path).parent)
        lines += [
            "umask 077",
            f"mkdir -p {shlex.quote(log_dir)}",
            f"exec {shlex.join(command)} >/dev/null 2>>{shlex.quote(log_path)}",
        ]
    else:
        lines.append(f"exec {shlex.join(command)}")
    return "\n".join(lines) + "\n"


# --- inputs -------------------------------------------------------------------------------


def feature_name(text: str) -> str:
    """A Slurm node feature from free text: characters outside ``[A-Za-z0-9_.-]`` become ``_``
    (commas separate features on a ``Features=`` line; ``&|[]()*:!`` are constraint operators,
    sbatch(1) ``--constraint``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def driver_feature(version: str) -> str:
    """The feature naming an NVIDIA driver version, e.g. ``driver_550.54.15``, so a job can ask
    ``--constraint=driver_550.54.15`` and mixed-driver nodes are told apart."""
    return feature_name(f"driver_{version}")


# ``host`` keys of an inventory node (gpufleet.devices.host.HostTopology)
_HOST_FIELDS = (
    "cpus",
    "boards",
    "sockets_per_board",
    "cores_per_socket",
    "threads_per_core",
    "memory_mb",
)


def _host(n: Mapping[str, Any], where: str) -> dict[str, int]:
    host = n.get("host")
    if host is None:
        return {}
    if not isinstance(host, Mapping):
        raise ConfigError(f"{where}.host must be a mapping (CPU topology and memory)")
    out: dict[str, int] = {}
    for key in _HOST_FIELDS:
        v = host.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}.host.{key} must be a whole number >= 1, not {v!r}")
        out[key] = v
    return out


def _cores(gpu: Mapping[str, Any], where: str) -> tuple[int, ...]:
    """A GPU's ``cores`` (logical core indexes close to it, gres.conf(5) Cores); () absent."""
    cores = gpu.get("cores")
    if cores is None:
        return ()
    if not isinstance(cores, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cores
    ):
        raise ConfigError(f"{where}.cores must be a list of core indexes >= 0, not {cores!r}")
    return tuple(sorted(set(cores)))


def _all_or_none(cores: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    return tuple(cores) if cores and all(cores) else ()


def from_inventory(doc: Mapping[str, Any], source: str = "inventory") -> ClusterSpec:
    """A cluster from ``gpufleet inventory --json``: one node per inventory node, GPUs typed by
    catalog model, its CPU topology and memory when the inventory has them (``host``), and
    features naming its GPU types and driver versions; all nodes under one switch (an
    inventory knows no fabric)."""
    nodes_doc = doc.get("nodes")
    if not isinstance(nodes_doc, list) or not nodes_doc:
        raise ConfigError(f"{source}: 'nodes' must be a non-empty list")
    nodes: list[NodeSpec] = []
    for i, n in enumerate(nodes_doc):
        name = n.get("name") if isinstance(n, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{source}: nodes[{i}].name is missing")
        counts: dict[str, int] = {}
        drivers: list[str] = []
        by_type: dict[str, list[tuple[int, ...]]] = {}
        for j, g in enumerate(n.get("gpus") or []):
            t = gres_type(g.get("model"))
            counts[t] = counts.get(t, 0) + 1
            by_type.setdefault(t, []).append(_cores(g, f"{source}: nodes[{i}].gpus[{j}]"))
            d = g.get("driver_version")
            if isinstance(d, str) and d and d not in drivers:
                drivers.append(d)
        node_driver = n.get("driver_version")
        if not drivers and isinstance(node_driver, str) and node_driver:
            drivers.append(node_driver)
        features = tuple(feature_name(t) for t in counts) + tuple(map(driver_feature, drivers))
        h = _host(n, f"{source}: nodes[{i}]")
        nodes.append(
            NodeSpec(
                name=name,
                gpus=tuple(counts.items()),
                cpus=h.get("cpus"),
                real_memory_mb=h.get("memory_mb"),
                boards=h.get("boards"),
                sockets_per_board=h.get("sockets_per_board"),
                cores_per_socket=h.get("cores_per_socket"),
                threads_per_core=h.get("threads_per_core"),
                features=features,
                # in the order of ``gpus`` (grouped by type); unknown unless every GPU has it
                gpu_cores=_all_or_none([c for t in counts for c in by_type[t]]),
                figures_from="inventory" if h else None,
            )
        )
    switches = (SwitchSpec("leaf1", nodes=tuple(n.name for n in nodes)),)
    notes = ["inventory has no fabric: every node under one switch"]
    bare = [n.name for n in nodes if _topology(n) is None or not n.real_memory_mb]
    if bare:
        notes.append(
            f"no CPU topology or memory for {compress(bare)} (simulated, or an inventory "
            "without 'host'): their NodeName lines leave them to slurmd"
        )
    return ClusterSpec(tuple(nodes), switches, notes=tuple(notes))


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
    from gpufleet.schedulers.slurm.node_facts import catalog_node

    shape = catalog_node(None if server.get("generic") else server.get("key"), per)
    nodes = tuple(replace(shape, name=n, gpus=((gtype, per),)) for n in names)
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
    cluster: ClusterSpec,
    base_port: int,
    dev_dir: Path,
    cpus: int = 1,
    memory_mb: int = 1000,
    ports: Sequence[int] | None = None,
) -> ClusterSpec:
    """The same cluster placed on this host for testing: every node at 127.0.0.1 on its own
    port (``ports[i]``, else ``base_port + i``), its GPUs backed by fake device files under
    ``dev_dir`` (made by devcluster); nodes without CPUs or memory get ``cpus``/``memory_mb``
    (less than any host has)."""
    if ports is not None and len(ports) != len(cluster.nodes):
        raise ConfigError(f"{len(ports)} port(s) for {len(cluster.nodes)} node(s)")
    nodes = []
    for i, n in enumerate(cluster.nodes):
        files = tuple(str(dev_dir / f"nvidia{j}") for j in range(n.gpu_count))
        nodes.append(
            replace(
                n,
                hostname="localhost",
                addr="127.0.0.1",
                port=ports[i] if ports is not None else base_port + i,
                cpus=n.cpus or cpus,  # a node with its host's topology keeps it
                real_memory_mb=n.real_memory_mb or memory_mb,
                gpu_files=files,
            )
        )
    return replace(cluster, nodes=tuple(nodes))
