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

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from gpufleet.catalog import load_catalog
from gpufleet.catalog.loader import gpu_key
from gpufleet.devices.sim.faults import Fault, FaultKind
from gpufleet.errors import ConfigError, UnknownNameError
from gpufleet.yamldoc import Document, field_error, read_text_file, read_yaml, validate

_SHORT = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(?:(\d+)\s*x\s*)?([A-Za-z][\w.\-]*)\s*$", re.IGNORECASE)
MAX_GPUS_PER_NODE = 64
# A simulated fleet lives in one process: 100,000 nodes (10x the 10,000-node benchmark) is the
# most it is sized for; a bigger count is a typo, refused before any memory is spent on it
MAX_SIM_NODES = 100_000
Count = Annotated[int, Field(strict=True, ge=1)]
Seconds = Annotated[float, Field(strict=True, ge=0)]


class _FileModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeEntry(_FileModel):
    """One ``nodes`` entry of a fleet file (``count`` nodes named ``name-00``, ...)."""

    model: str
    name: str | None = None
    gpus: Annotated[int, Field(strict=True, ge=1, le=MAX_GPUS_PER_NODE)] = 8
    count: Count = 1
    rack: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    mig_enabled: Annotated[bool, Field(strict=True)] = False
    mig_layout: list[str] = Field(default_factory=list)
    power_admin: Annotated[bool, Field(strict=True)] = True  # False: set calls get NoPermission


class FaultEntry(_FileModel):
    """One ``faults`` entry; the parameters of its kind are checked by that kind's model."""

    model_config = ConfigDict(frozen=True, extra="allow")
    kind: str
    node: str | None = None
    gpu: Annotated[int, Field(strict=True, ge=0)] | None = None
    at_s: Seconds = 0.0
    duration_s: Seconds | None = None


class FaultsFile(_FileModel):
    """A faults file: ``faults:`` with a list of faults (a bare list is read as that)."""

    faults: list[FaultEntry]


class FleetFile(_FileModel):
    """A YAML fleet file (format in the module doc)."""

    nodes: list[NodeEntry] = Field(min_length=1)
    seed: Annotated[int, Field(strict=True, ge=0)] = 7
    faults: list[FaultEntry] = Field(default_factory=list)


def _number(lo: float, hi: float) -> Any:
    return (Annotated[float, Field(strict=True, ge=lo, le=hi)] | None, None)


def _whole(lo: int, hi: int) -> Any:
    return (Annotated[int, Field(strict=True, ge=lo, le=hi)] | None, None)


# The parameters each fault kind reads, with their type and range (the simulator reads no
# others, so a misspelt one would silently do nothing).
_FAULT_PARAMS: dict[FaultKind, dict[str, Any]] = {
    FaultKind.XID: {"xid": _whole(1, 65535)},
    FaultKind.ECC_SBE: {"count": _whole(0, 10**9), "rate_per_min": _number(0, 1e9)},
    FaultKind.ECC_DBE: {"count": _whole(0, 10**9)},
    FaultKind.RETIRED_PAGES: {"sbe": _whole(0, 10**6), "dbe": _whole(0, 10**6)},
    FaultKind.PCIE_DOWNGRADE: {"gen": _whole(1, 6), "width": _whole(1, 32)},
    FaultKind.PCIE_REPLAYS: {"rate_per_min": _number(0, 1e9)},
    FaultKind.SLOW_GPU: {"fraction": _number(0, 1)},
    FaultKind.HUNG_CALL: {"seconds": _number(0, 86400)},
    FaultKind.MEMORY_ERRORS: {"count": _whole(0, 10**6)},
    FaultKind.SLOW_LINK: {"fraction": _number(0, 1), "peer": (str | None, None)},
    FaultKind.NVLINK_ERRORS: {
        "rate_per_min": _number(0, 1e9),
        "link": _whole(0, 17),
        "recovery": _whole(0, 10**6),
        "down": (bool | None, None),
        "fraction": _number(0, 1),
    },
}
_PARAM_MODELS: dict[FaultKind, type[BaseModel]] = {
    kind: create_model(
        f"{kind.name.title()}Params", __base__=_FileModel, **_FAULT_PARAMS.get(kind, {})
    )
    for kind in FaultKind
}


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
    power_admin: bool = True  # whether NVML set calls succeed (as root); False: NoPermission


@dataclass(frozen=True)
class FleetSpec:
    """A simulated fleet: nodes, a seed, and faults to inject."""

    nodes: tuple[NodeSpec, ...]
    seed: int = 7
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    # the fleet file read (None: a short spec); its nodes keep their locked clocks beside it
    # (`gpufleet.devices.sim.locks`)
    source: Path | None = field(default=None, compare=False)

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)


def _catalog_key(doc: Document, loc: tuple[int | str, ...], name: str) -> str:
    try:
        return load_catalog().gpu(name).key
    except UnknownNameError as exc:
        raise field_error(doc, loc, str(exc)) from exc


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
    if nodes > MAX_SIM_NODES:
        raise ConfigError(f"--sim {text!r}: at most {MAX_SIM_NODES:,} simulated nodes")
    if gpus > 64:
        raise ConfigError(f"--sim {text!r}: at most 64 GPUs per node")
    key = gpu_key(model, f"--sim {text!r}")
    width = max(2, len(str(nodes)))
    specs = tuple(
        NodeSpec(name=f"{prefix}-{i:0{width}d}", model=key, gpus=gpus) for i in range(nodes)
    )
    return FleetSpec(nodes=specs, seed=seed)


def _fault(
    doc: Document, i: int, entry: FaultEntry, gpus_per_node: Mapping[str, int | None]
) -> Fault:
    """One checked fault: a known kind, an existing node and GPU, the kind's own parameters
    (``gpus_per_node``: None where a node's GPU count is not known)."""
    loc: tuple[int | str, ...] = ("faults", i)
    try:
        kind = FaultKind(entry.kind)
    except ValueError as exc:
        err = UnknownNameError("fault kind", entry.kind, [k.value for k in FaultKind])
        raise field_error(doc, (*loc, "kind"), str(err)) from exc
    if entry.node is not None and entry.node not in gpus_per_node:
        err = UnknownNameError("node", entry.node, sorted(gpus_per_node))
        raise field_error(doc, (*loc, "node"), str(err))
    params = dict(entry.model_extra or {})
    if params and not _FAULT_PARAMS.get(kind):
        key = next(iter(params))
        raise field_error(doc, (*loc, key), f"fault kind {kind.value!r} takes no parameters")
    checked = (
        validate(_PARAM_MODELS[kind], doc, prefix=loc, exclude=FaultEntry.model_fields)
        if params
        else None
    )
    if checked is not None:
        params = checked.model_dump(exclude_none=True)
    if entry.gpu is not None:
        for name in [entry.node] if entry.node is not None else sorted(gpus_per_node):
            count = gpus_per_node[name]
            if count is not None and entry.gpu >= count:
                raise field_error(
                    doc,
                    (*loc, "gpu"),
                    f"node {name!r} has {count} GPU(s) (0-{count - 1}), not GPU {entry.gpu}",
                )
    return Fault(
        kind=kind,
        node=entry.node,
        gpu=entry.gpu,
        at_s=float(entry.at_s),
        duration_s=None if entry.duration_s is None else float(entry.duration_s),
        params=params,
    )


def parse_fleet_yaml(text: str, source: str = "<fleet>") -> FleetSpec:
    """Parse a YAML fleet file; errors name the file, line and field path."""
    doc = read_yaml(text, source)
    if not isinstance(doc.data, dict):
        raise field_error(doc, (), "expected a mapping with a non-empty 'nodes' list")
    fleet = validate(FleetFile, doc)
    if sum(item.count for item in fleet.nodes) > MAX_SIM_NODES:
        raise field_error(doc, ("nodes",), f"at most {MAX_SIM_NODES:,} simulated nodes in all")
    nodes: list[NodeSpec] = []
    for i, item in enumerate(fleet.nodes):
        key = _catalog_key(doc, ("nodes", i, "model"), item.model)
        base = item.name or f"sim-{key}"
        for c in range(item.count):
            nodes.append(
                NodeSpec(
                    name=base if item.count == 1 else f"{base}-{c:02d}",
                    model=key,
                    gpus=item.gpus,
                    rack=item.rack,
                    driver_version=item.driver_version,
                    vbios_version=item.vbios_version,
                    mig_enabled=item.mig_enabled or bool(item.mig_layout),
                    mig_layout=tuple(item.mig_layout),
                    power_admin=item.power_admin,
                )
            )
    names = [n.name for n in nodes]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise field_error(doc, ("nodes",), f"duplicate node names {sorted(dupes)}")
    gpus_per_node = {n.name: n.gpus for n in nodes}
    faults = tuple(_fault(doc, i, f, gpus_per_node) for i, f in enumerate(fleet.faults))
    return FleetSpec(nodes=tuple(nodes), seed=fleet.seed, faults=faults)


def parse_faults_yaml(text: str, source: str, nodes: Iterable[str]) -> tuple[Fault, ...]:
    """A faults file (a list of faults, or a mapping with ``faults``) for the named nodes."""
    doc = read_yaml(text, source)
    if isinstance(doc.data, list):
        doc.data = {"faults": doc.data}
    if not isinstance(doc.data, dict):
        raise field_error(doc, (), "expected a list of faults (or a mapping with 'faults')")
    entries = validate(FaultsFile, doc).faults
    known: dict[str, int | None] = dict.fromkeys(nodes)
    return tuple(_fault(doc, i, f, known) for i, f in enumerate(entries))


def parse_fleet_spec(spec: str, seed: int = 7) -> FleetSpec:
    """A short spec or the path of a YAML fleet file (as its simulated updates left it:
    `gpufleet.devices.sim.state`)."""
    path = Path(spec)
    if spec.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{spec}: no such fleet file")
        from gpufleet.devices.sim.state import with_sim_state

        fleet = with_sim_state(parse_fleet_yaml(read_text_file(path, "fleet file"), spec), path)
        return dataclasses.replace(fleet, source=path)
    return parse_short_spec(spec, seed=seed)
