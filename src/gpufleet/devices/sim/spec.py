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


def _parse_fault(item: Any, where: str, node_names: set[str]) -> Fault:
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
    params = {k: v for k, v in item.items() if k not in _FAULT_KEYS}
    try:
        return Fault(
            kind=kind,
            node=None if node is None else str(node),
            gpu=None if item.get("gpu") is None else int(item["gpu"]),
            at_s=float(item.get("at_s", 0.0)),
            duration_s=None if item.get("duration_s") is None else float(item["duration_s"]),
            params=params,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def parse_fleet_yaml(text: str, source: str = "<fleet>") -> FleetSpec:
    """Parse a YAML fleet file; errors name the file and the field path."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise ConfigError(f"{source}: expected a mapping with a non-empty 'nodes' list")
    seed = int(doc.get("seed", 7))
    nodes: list[NodeSpec] = []
    for i, item in enumerate(doc["nodes"]):
        where = f"{source}: nodes[{i}]"
        if not isinstance(item, dict) or "model" not in item:
            raise ConfigError(f"{where}: expected a mapping with at least 'model'")
        key = _model_key(str(item["model"]), f"{where}.model")
        count = int(item.get("count", 1))
        base = str(item.get("name", f"sim-{key}"))
        gpus = int(item.get("gpus", 8))
        if gpus < 1 or count < 1:
            raise ConfigError(f"{where}: 'gpus' and 'count' must be at least 1")
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
    faults = tuple(
        _parse_fault(f, f"{source}: faults[{i}]", set(names))
        for i, f in enumerate(doc.get("faults") or [])
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
