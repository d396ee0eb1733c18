"""Simulated fleet specs: ``--sim 2x8xh100-sxm`` (nodes x GPUs x model) or a YAML fleet file.

YAML fleet file::

    seed: 7
    nodes:
      - {name: gpu-a, model: h100-sxm, gpus: 8, count: 4, rack: r01}
      - {model: h200, gpus: 8, driver_version: "570.86.15"}
    faults:
      - {node: gpu-a-02, gpu: 3, kind: xid, xid: 79, at_s: 10}
      - {node: gpu-a-01, gpu: 0, kind: slow_gpu, fraction: 0.85}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.catalog import load_catalog
from gpufleet.devices.sim.faults import Fault, FaultKind
from gpufleet.errors import ConfigError, UnknownNameError

_SHORT = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(?:(\d+)\s*x\s*)?([A-Za-z][\w.\-]*)\s*$", re.IGNORECASE)
_FAULT_KEYS = {"node", "gpu", "kind", "at_s", "duration_s"}
_NODE_KEYS = (
    "name",
    "model",
    "gpus",
    "count",
    "rack",
    "driver_version",
    "vbios_version",
    "mig_enabled",
    "mig_layout",
)
_TOP_KEYS = ("seed", "nodes", "faults")
# The parameters each fault kind reads, with their type and range (the simulator reads no
# others, so a misspelt one would silently do nothing).
_NUMBER = (int, float)
_FAULT_PARAMS: dict[FaultKind, dict[str, tuple[type | tuple[type, ...], float, float]]] = {
    FaultKind.XID: {"xid": (int, 1, 65535)},
    FaultKind.ECC_SBE: {"count": (int, 0, 1e9), "rate_per_min": (_NUMBER, 0, 1e9)},
    FaultKind.ECC_DBE: {"count": (int, 0, 1e9)},
    FaultKind.RETIRED_PAGES: {"sbe": (int, 0, 1e6), "dbe": (int, 0, 1e6)},
    FaultKind.PCIE_DOWNGRADE: {"gen": (int, 1, 6), "width": (int, 1, 32)},
    FaultKind.PCIE_REPLAYS: {"rate_per_min": (_NUMBER, 0, 1e9)},
    FaultKind.SLOW_GPU: {"fraction": (_NUMBER, 0, 1)},
    FaultKind.HUNG_CALL: {"seconds": (_NUMBER, 0, 86400)},
    FaultKind.MEMORY_ERRORS: {"count": (int, 0, 1e6)},
    FaultKind.SLOW_LINK: {"fraction": (_NUMBER, 0, 1), "peer": (str, 0, 0)},
    FaultKind.NVLINK_ERRORS: {"rate_per_min": (_NUMBER, 0, 1e9)},
}


def _unknown_keys(item: dict[str, Any], known: tuple[str, ...], where: str, sep: str = ".") -> None:
    """Reject a misspelt key (it would otherwise be ignored) with a did-you-mean."""
    for key in item:
        if str(key) not in known:
            err = UnknownNameError("field", str(key), sorted(known))
            raise ConfigError(f"{where}{sep}{key}: {err.message}", hint=err.hint)


def _int(value: Any, where: str, minimum: int = 0) -> int:
    """An integer field (YAML ints, not floats or strings) at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected a whole number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: must be at least {minimum}, got {value}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number of seconds, got {value!r}")
    if value < 0:
        raise ConfigError(f"{where}: must be at least 0, got {value}")
    return float(value)


def _check_params(kind: FaultKind, params: dict[str, Any], where: str) -> None:
    allowed = _FAULT_PARAMS.get(kind, {})
    for key, value in params.items():
        if key not in allowed:
            if not allowed:
                raise ConfigError(f"{where}.{key}: fault kind {kind.value!r} takes no parameters")
            err = UnknownNameError(f"parameter of {kind.value!r}", str(key), sorted(allowed))
            raise ConfigError(f"{where}.{key}: {err.message}", hint=err.hint)
        types, lo, hi = allowed[key]
        if types is str:
            if not isinstance(value, str):
                raise ConfigError(f"{where}.{key}: expected a name, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            what = "a whole number" if types is int else "a number"
            raise ConfigError(f"{where}.{key}: expected {what}, got {value!r}")
        assert isinstance(value, int | float)  # checked above; for the type checker
        if not lo <= value <= hi:
            raise ConfigError(f"{where}.{key}: {value} is out of range ({lo:g} to {hi:g})")


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node."""

    name: str
    model: str
    gpus: int = 8
    rack: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    mig_enabled: bool = False
    mig_layout: tuple[str, ...] = ()  # GPU-instance profiles, e.g. ("3g.71gb", "4g.71gb")


@dataclass(frozen=True)
class FleetSpec:
    """A simulated fleet: nodes, a seed, and faults to inject."""

    nodes: tuple[NodeSpec, ...]
    seed: int = 7
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)


def _model_key(name: str, where: str) -> str:
    try:
        return load_catalog().gpu(name).key
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from exc


def parse_short_spec(text: str, seed: int = 7, prefix: str = "sim") -> FleetSpec:
    """``NODESxGPUSxMODEL``, ``GPUSxMODEL`` (one node) or ``MODEL`` (one node of 8)."""
    m = _SHORT.match(text)
    if not m:
        raise ConfigError(
            f"--sim {text!r}: expected NODESxGPUSxMODEL (e.g. 2x8xh100-sxm), "
            "GPUSxMODEL or a YAML file"
        )
    a, b, model = m.groups()
    nodes, gpus = (int(a), int(b)) if b is not None else (1, int(a) if a else 8)
    if nodes < 1 or gpus < 1:
        raise ConfigError(f"--sim {text!r}: node and GPU counts must be at least 1")
    if gpus > 64:
        raise ConfigError(f"--sim {text!r}: at most 64 GPUs per node")
    key = _model_key(model, f"--sim {text!r}")
    width = max(2, len(str(nodes)))
    specs = tuple(
        NodeSpec(name=f"{prefix}-{i:0{width}d}", model=key, gpus=gpus) for i in range(nodes)
    )
    return FleetSpec(nodes=specs, seed=seed)


def _parse_fault(
    item: Any, where: str, node_names: set[str], gpus_per_node: dict[str, int] | None = None
) -> Fault:
    """One fault of a fleet file; ``gpus_per_node`` (when known) bounds its ``gpu`` index."""
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping with at least 'kind'")
    kind_text = str(item.get("kind", ""))
    try:
        kind = FaultKind(kind_text)
    except ValueError as exc:
        err = UnknownNameError("fault kind", kind_text, [k.value for k in FaultKind])
        raise ConfigError(f"{where}.kind: {err.message}", hint=err.hint) from exc
    node = item.get("node")
    if node is not None and str(node) not in node_names:
        err = UnknownNameError("node", str(node), sorted(node_names))
        raise ConfigError(f"{where}.node: {err.message}", hint=err.hint)
    params = {str(k): v for k, v in item.items() if k not in _FAULT_KEYS}
    _check_params(kind, params, where)
    gpu = None if item.get("gpu") is None else _int(item["gpu"], f"{where}.gpu")
    if gpu is not None and gpus_per_node:
        targets = [str(node)] if node is not None else sorted(gpus_per_node)
        for name in targets:
            if gpu >= gpus_per_node[name]:
                raise ConfigError(
                    f"{where}.gpu: node {name!r} has {gpus_per_node[name]} GPU(s) "
                    f"(0-{gpus_per_node[name] - 1}), not GPU {gpu}"
                )
    duration = item.get("duration_s")
    return Fault(
        kind=kind,
        node=None if node is None else str(node),
        gpu=gpu,
        at_s=_seconds(item.get("at_s", 0.0), f"{where}.at_s"),
        duration_s=None if duration is None else _seconds(duration, f"{where}.duration_s"),
        params=params,
    )


def parse_fleet_yaml(text: str, source: str = "<fleet>") -> FleetSpec:
    """Parse a YAML fleet file; errors name the file and the field path."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"{source}: {where}not valid YAML ({problem})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise ConfigError(f"{source}: expected a mapping with a non-empty 'nodes' list")
    _unknown_keys(doc, _TOP_KEYS, source, sep=": ")
    seed = _int(doc.get("seed", 7), f"{source}: seed")
    nodes: list[NodeSpec] = []
    for i, item in enumerate(doc["nodes"]):
        where = f"{source}: nodes[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping with at least 'model'")
        _unknown_keys(item, _NODE_KEYS, where)
        if "model" not in item:
            raise ConfigError(f"{where}: expected a mapping with at least 'model'")
        key = _model_key(str(item["model"]), f"{where}.model")
        count = _int(item.get("count", 1), f"{where}.count", minimum=1)
        base = str(item.get("name", f"sim-{key}"))
        gpus = _int(item.get("gpus", 8), f"{where}.gpus", minimum=1)
        if gpus > 64:
            raise ConfigError(f"{where}.gpus: at most 64 GPUs per node, got {gpus}")
        for c in range(count):
            name = base if count == 1 else f"{base}-{c:02d}"
            nodes.append(
                NodeSpec(
                    name=name,
                    model=key,
                    gpus=gpus,
                    rack=item.get("rack"),
                    driver_version=item.get("driver_version"),
                    vbios_version=item.get("vbios_version"),
                    mig_enabled=bool(item.get("mig_enabled", False) or item.get("mig_layout")),
                    mig_layout=tuple(str(p) for p in item.get("mig_layout") or ()),
                )
            )
    names = [n.name for n in nodes]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"{source}: duplicate node names {sorted(dupes)}")
    faults_doc = doc.get("faults") or []
    if not isinstance(faults_doc, list):
        raise ConfigError(f"{source}: faults: expected a list of faults")
    gpus_per_node = {n.name: n.gpus for n in nodes}
    faults = tuple(
        _parse_fault(f, f"{source}: faults[{i}]", set(names), gpus_per_node)
        for i, f in enumerate(faults_doc)
    )
    return FleetSpec(nodes=tuple(nodes), seed=seed, faults=faults)


def parse_fleet_spec(spec: str, seed: int = 7) -> FleetSpec:
    """A short spec or the path of a YAML fleet file."""
    path = Path(spec)
    if spec.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{spec}: no such fleet file")
        return parse_fleet_yaml(path.read_text(encoding="utf-8"), source=spec)
    return parse_short_spec(spec, seed=seed)
