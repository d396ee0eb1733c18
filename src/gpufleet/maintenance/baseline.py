"""The firmware and software baseline: target versions per GPU model, and the nodes that
are not at them.

``baseline.yaml``::

    models:
      h100-sxm:
        driver: "550.90.07"
        vbios: "96.00.99.00.01"
        inforom: "G520.0200.00.05"
        cuda: "12.4"
        kernel: "5.15.0-105-generic"    # optional; checked where the inventory reports it

Model keys are catalog keys (``gpufleet catalog gpus``). A version a node does not report
(NVML answered N/A, or an nvidia-smi report lacks it) is *unknown*, never taken as a match:
the node is listed as not verified, so a campaign updates or at least inspects it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpufleet.catalog import load_catalog
from gpufleet.catalog.cuda import pair_problem
from gpufleet.devices.types import NodeInventory
from gpufleet.yamldoc import FieldError, field_error, read_text_file, read_yaml, validate
from gpufleet.yamldoc import did_you_mean as _did_you_mean

# baseline key -> DeviceInfo attribute (per GPU); "kernel" is per node.
GPU_FIELDS = {
    "driver": "driver_version",
    "vbios": "vbios_version",
    "inforom": "inforom_version",
    "cuda": "cuda_driver_version",
}


class ModelTarget(BaseModel):
    """Target versions for one GPU model; a field left out is not checked."""

    model_config = ConfigDict(extra="forbid")

    driver: str | None = None
    vbios: str | None = None
    inforom: str | None = None
    cuda: str | None = None
    kernel: str | None = None


class BaselineFile(BaseModel):
    """The whole ``baseline.yaml``."""

    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelTarget]


@dataclass(frozen=True)
class Deviation:
    """One version that is not the target: where, what was found, what is wanted."""

    node: str
    gpu: int | None  # None for node-level fields (kernel)
    field: str  # a baseline key: driver, vbios, inforom, cuda, kernel
    found: str | None  # None: not reported (unknown)
    target: str
    status: Literal["differs", "unknown"]


@dataclass
class NodeBaseline:
    """How one node stands against the baseline."""

    node: str
    model: str | None
    deviations: list[Deviation] = field(default_factory=list)
    no_target: bool = False  # its model has no entry in the baseline

    @property
    def compliant(self) -> bool:
        return not self.no_target and not self.deviations

    @property
    def verified(self) -> bool:
        return not any(d.status == "unknown" for d in self.deviations)


def load_baseline(path: Path) -> BaselineFile:
    """``baseline.yaml`` checked: one error naming the file, line and field."""
    text = read_text_file(path, "baseline")
    doc = read_yaml(text, str(path))
    baseline = validate(BaselineFile, doc)
    known = load_catalog().gpus
    for key, target in baseline.models.items():
        if key not in known:
            problem = f"unknown GPU model {key!r}{_did_you_mean(key, known)}"
            raise FieldError(doc.source, f"models.{key}", problem, doc.key_line(("models", key)))
        if not target.model_dump(exclude_none=True):
            raise field_error(doc, ("models", key), "no target version given")
        # a driver reports one CUDA version, its own: a pair it cannot report never verifies
        if target.driver and target.cuda:
            pair = pair_problem(target.driver, target.cuda)
            if pair:
                raise field_error(doc, ("models", key, "cuda"), pair)
    return baseline


def node_model(node: NodeInventory) -> str | None:
    """The node's GPU model (the most common one among its GPUs)."""
    models = [g.model for g in node.gpus if g.model]
    return max(set(models), key=models.count) if models else None


def check_node(
    node: NodeInventory, baseline: BaselineFile, kernel: str | None = None
) -> NodeBaseline:
    """The deviations of one node; ``kernel`` is the node's OS kernel where known."""
    gpus = [(g.index, {attr: getattr(g, attr) for attr in GPU_FIELDS.values()}) for g in node.gpus]
    return check_versions(node.name, node_model(node), gpus, baseline, kernel)


def check_versions(
    name: str,
    model: str | None,
    gpus: Iterable[tuple[int, Mapping[str, Any]]],
    baseline: BaselineFile,
    kernel: str | None = None,
) -> NodeBaseline:
    """The deviations of one node from its GPUs' versions, each GPU given as (index, its
    device info keyed by `DeviceInfo` attribute: ``driver_version``...). A version that is
    absent or None is unknown and never matches."""
    out = NodeBaseline(name, model)
    target = baseline.models.get(model or "")
    if target is None:
        out.no_target = True
        return out
    wanted = target.model_dump(exclude_none=True)
    for index, info in gpus:
        for key, attr in GPU_FIELDS.items():
            if key not in wanted:
                continue
            found = info.get(attr)
            if found is None or str(found) != wanted[key]:
                out.deviations.append(
                    Deviation(
                        name,
                        index,
                        key,
                        None if found is None else str(found),
                        wanted[key],
                        "unknown" if found is None else "differs",
                    )
                )
    if "kernel" in wanted and kernel != wanted["kernel"]:
        status: Literal["differs", "unknown"] = "unknown" if kernel is None else "differs"
        out.deviations.append(Deviation(name, None, "kernel", kernel, wanted["kernel"], status))
    return out


def check_fleet(
    nodes: list[NodeInventory], baseline: BaselineFile, kernels: dict[str, str] | None = None
) -> list[NodeBaseline]:
    """Every node against the baseline, in the inventory's order."""
    kernels = kernels or {}
    return [check_node(n, baseline, kernels.get(n.name)) for n in nodes]


def summarize(deviations: list[Deviation]) -> list[str]:
    """One line per (field, found) on a node: ``driver 535.104.05 -> 550.90.07 (GPUs 0-7)``."""
    groups: dict[tuple[str, str | None, str], list[int | None]] = {}
    for d in deviations:
        groups.setdefault((d.field, d.found, d.target), []).append(d.gpu)
    lines = []
    for (key, found, target), gpus in groups.items():
        where = "" if gpus == [None] else f" (GPU {_ranges([g for g in gpus if g is not None])})"
        lines.append(f"{key} {found or 'unknown'} -> {target}{where}")
    return lines


def _ranges(values: list[int]) -> str:
    """``0-3,5`` for [0, 1, 2, 3, 5]."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
