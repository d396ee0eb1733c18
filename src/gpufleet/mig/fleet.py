"""The GPUs a MIG plan covers: from ``--gpus``, an inventory, a plan, or a current-layout file.

``--gpus``: comma-separated ``[NODES x] GPUS x MODEL`` terms, e.g. ``8xh200`` (one node of 8),
``2x8xh100`` (two nodes of 8), ``8xh200,4xh100``.

A current-layout file (also what ``gpufleet mig plan --out`` writes) lists each node's GPUs in
index order with their instance counts; ``{}`` is a GPU with MIG off::

    nodes:
      - name: node-0
        model: h200
        gpus:
          - {1g.18gb: 7}
          - {3g.71gb: 2}
          - {}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.catalog import load_catalog
from gpufleet.catalog.loader import gpu_key
from gpufleet.errors import ConfigError, ParseError, UnknownNameError
from gpufleet.mig.layouts import Layout, layout_for_counts
from gpufleet.yamldoc import field_error, read_text_file, read_yaml, validate

__all__ = [
    "FleetGpu",
    "fleet_from_inventory",
    "fleet_from_plan",
    "load_current",
    "parse_gpus",
]

_TERM = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\d+)\s*x\s*([A-Za-z0-9][\w.\-]*)\s*$", re.I)


@dataclass(frozen=True)
class FleetGpu:
    """One GPU: its node, index on the node, catalog model key, and today's layout."""

    node: str
    index: int
    model: str
    current: Layout | None = None  # None: unknown, treated as MIG off


def parse_gpus(text: str, source: str = "--gpus") -> list[FleetGpu]:
    """Parse ``[NODES x] GPUS x MODEL[, ...]`` into GPUs on named nodes."""
    out: list[FleetGpu] = []
    node_no = 0
    for raw in text.split(","):
        if not raw.strip():
            continue
        m = _TERM.match(raw)
        if m is None:
            raise ParseError(
                source, repr(raw.strip()), "expected [NODES x] GPUS x MODEL, e.g. 8xh200"
            )
        nodes = int(m[1]) if m[1] else 1
        per = int(m[2])
        if nodes < 1 or per < 1:
            raise ParseError(source, repr(raw.strip()), "counts must be at least 1")
        key = gpu_key(m[3], source)
        for _ in range(nodes):
            out.extend(FleetGpu(f"node-{node_no}", i, key) for i in range(per))
            node_no += 1
    if not out:
        raise ConfigError(f"{source}: no GPUs given")
    return out


def _read_doc(path: Path) -> Any:
    text = read_text_file(path, "document")
    if path.suffix != ".json":
        return read_yaml(text, str(path)).data
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(str(path), "document", f"not valid JSON: {exc}") from exc


def fleet_from_inventory(path: Path) -> list[FleetGpu]:
    """GPUs from ``gpufleet inventory --json`` output (``nodes[].gpus[].model``), with today's
    MIG layout where the inventory lists it (``mig_devices``, from ``inventory --import``)."""
    doc = _read_doc(path)
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise ParseError(str(path), "nodes", "expected the output of 'gpufleet inventory --json'")
    out: list[FleetGpu] = []
    for n, node in enumerate(nodes):
        name = str(node.get("name", f"node-{n}"))
        for g, gpu in enumerate(node.get("gpus") or []):
            model = gpu.get("model") or gpu.get("name")
            if not model:
                raise ParseError(str(path), f"nodes[{n}].gpus[{g}]", "no model or name")
            key = gpu_key(str(model), f"{path}: nodes[{n}].gpus[{g}]")
            current = _inventory_layout(key, gpu, f"{path}: nodes[{n}].gpus[{g}]")
            out.append(FleetGpu(name, int(gpu.get("index", g)), key, current))
    if not out:
        raise ConfigError(f"{path}: the inventory lists no GPUs")
    return out


def _inventory_layout(model: str, gpu: dict[str, Any], where: str) -> Layout | None:
    """Today's layout of an inventoried GPU: its GPU instances (one per ``gpu_instance_id`` of
    ``mig_devices``, from ``inventory --import``) by profile; an empty layout when MIG is off;
    None when the inventory does not say (treated as MIG off by the planner)."""
    devices = gpu.get("mig_devices")
    if gpu.get("mig_current") is False:
        return layout_for_counts(model, {}, where)
    if not isinstance(devices, list) or not devices:
        return None
    profiles: dict[object, str] = {}
    for d, dev in enumerate(devices):
        profile = dev.get("profile") if isinstance(dev, dict) else None
        if not profile:
            raise ParseError(
                where, f"mig_devices[{d}]", "MIG device with no profile: cannot tell the layout"
            )
        profiles[dev.get("gpu_instance_id", d)] = str(profile)
    counts: dict[str, int] = {}
    for profile in profiles.values():
        counts[profile] = counts.get(profile, 0) + 1
    try:
        return layout_for_counts(model, counts, where)
    except (UnknownNameError, ConfigError) as exc:
        raise ParseError(where, "mig_devices", str(exc)) from exc


def fleet_from_plan(path: Path) -> list[FleetGpu]:
    """GPUs of the chosen candidate of ``gpufleet plan --json`` output."""
    doc = _read_doc(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("candidates"), list):
        raise ParseError(str(path), "candidates", "expected the output of 'gpufleet plan --json'")
    chosen = doc.get("chosen")
    cand = next((c for c in doc["candidates"] if c.get("candidate") == chosen), None)
    if cand is None:
        raise ParseError(str(path), "chosen", f"no candidate named {chosen!r}")
    server = cand.get("server") or {}
    try:
        key = gpu_key(str(server["gpu_key"]), f"{path}: server.gpu_key")
        per, servers = int(server["gpus"]), int(cand["servers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(str(path), f"candidate {chosen}", f"missing field {exc}") from exc
    return [FleetGpu(f"node-{n}", i, key) for n in range(servers) for i in range(per)]


InstanceCount = Annotated[int, Field(strict=True, ge=0)]


class CurrentNode(BaseModel):
    """One node of a current-layout file: its model and each GPU's instance counts."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    name: str | None = None
    gpus: list[dict[str, InstanceCount] | None]


class CurrentFile(BaseModel):
    """A current-layout file (format in the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    nodes: list[CurrentNode]


def load_current(path: Path) -> list[FleetGpu]:
    """GPUs with today's layouts, from a current-layout file (YAML, or JSON as YAML reads it)."""
    doc = read_yaml(read_text_file(path, "layout file"), str(path))
    if not isinstance(doc.data, dict):
        raise field_error(doc, (), "expected a mapping with a nodes list (name, model, gpus)")
    current = validate(CurrentFile, doc)
    out: list[FleetGpu] = []
    for n, node in enumerate(current.nodes):
        try:
            key = load_catalog().gpu(node.model).key
        except UnknownNameError as exc:
            raise field_error(doc, ("nodes", n, "model"), str(exc)) from exc
        name = node.name or f"node-{n}"
        for g, counts in enumerate(node.gpus):
            try:
                layout = layout_for_counts(key, counts or {}, "layout")
            except UnknownNameError as exc:
                raise field_error(doc, ("nodes", n, "gpus", g), str(exc)) from exc
            except ConfigError as exc:
                problem = exc.message.removeprefix("layout: ")
                raise field_error(doc, ("nodes", n, "gpus", g), problem) from exc
            out.append(FleetGpu(name, g, key, layout))
    return out


def current_document(gpus: list[tuple[FleetGpu, Layout]]) -> dict[str, Any]:
    """The current-layout document for GPUs and their (new) layouts."""
    nodes: dict[str, dict[str, Any]] = {}
    for gpu, layout in gpus:
        entry = nodes.setdefault(gpu.node, {"name": gpu.node, "model": gpu.model, "gpus": []})
        entry["gpus"].append(layout.counts)
    return {"nodes": list(nodes.values())}
