"""Configuration drift: versions that differ where they should match, links below their max.

Checked within each node (all GPUs of one model should run the same driver, VBIOS, CUDA and
InfoROM) and across nodes of the same model (the fleet should converge on one of each). The
majority value is reported as expected; every other value is listed with where it is.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from gpufleet.devices.types import DeviceInfo, NodeInventory

IDLE_NOTE = " (an idle GPU may train its link down to save power: recheck under load)"
VERSION_FIELDS = ("driver_version", "vbios_version", "cuda_driver_version", "inforom_version")


@dataclass(frozen=True)
class DriftItem:
    """One drift finding."""

    kind: str  # "version" or "pcie_link"
    scope: str  # "node" or "fleet"
    field: str
    model: str | None
    expected: str | None
    values: dict[str, list[str]]  # value -> ["node/gpu-index", ...]
    message: str


def _where(node: str, gpu: DeviceInfo) -> str:
    return f"{node}/{gpu.index}"


def _version_drift(
    scope: str, model: str | None, field: str, members: list[tuple[str, DeviceInfo]]
) -> DriftItem | None:
    values: dict[str, list[str]] = defaultdict(list)
    for node, gpu in members:
        v = getattr(gpu, field)
        if v is not None:
            values[str(v)].append(_where(node, gpu))
    if len(values) < 2:
        return None
    counts = Counter({v: len(w) for v, w in values.items()})
    expected = counts.most_common(1)[0][0]
    others = ", ".join(
        f"{v} on {', '.join(w[:4])}{'...' if len(w) > 4 else ''}"
        for v, w in values.items()
        if v != expected
    )
    where = f"node {members[0][0]}" if scope == "node" else f"{model or 'unknown model'} nodes"
    return DriftItem(
        kind="version",
        scope=scope,
        field=field,
        model=model,
        expected=expected,
        values=dict(values),
        message=f"mixed {field.replace('_', ' ')} within {where}: {expected} on most, {others}",
    )


def find_drift(nodes: list[NodeInventory]) -> list[DriftItem]:
    """All drift items of a fleet, node-level first, then fleet-level, then PCIe links."""
    items: list[DriftItem] = []
    by_model: dict[str | None, list[tuple[str, DeviceInfo]]] = defaultdict(list)
    for node in nodes:
        per_model: dict[str | None, list[tuple[str, DeviceInfo]]] = defaultdict(list)
        for gpu in node.gpus:
            per_model[gpu.model or gpu.name].append((node.name, gpu))
            by_model[gpu.model or gpu.name].append((node.name, gpu))
        for model, members in per_model.items():
            for field in VERSION_FIELDS:
                item = _version_drift("node", model, field, members)
                if item:
                    items.append(item)
    for model, members in by_model.items():
        if len({n for n, _ in members}) < 2:
            continue
        for field in VERSION_FIELDS:
            item = _version_drift("fleet", model, field, members)
            if item:
                items.append(item)
    for node in nodes:
        for gpu in node.gpus:
            low_gen = (
                gpu.pcie_gen_current is not None
                and gpu.pcie_gen_max is not None
                and gpu.pcie_gen_current < gpu.pcie_gen_max
            )
            low_width = (
                gpu.pcie_width_current is not None
                and gpu.pcie_width_max is not None
                and gpu.pcie_width_current < gpu.pcie_width_max
            )
            if low_gen or low_width:
                cur = f"Gen{gpu.pcie_gen_current} x{gpu.pcie_width_current}"
                mx = f"Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max}"
                items.append(
                    DriftItem(
                        kind="pcie_link",
                        scope="node",
                        field="pcie_link",
                        model=gpu.model,
                        expected=mx,
                        values={cur: [_where(node.name, gpu)]},
                        message=f"{node.name} GPU {gpu.index}: PCIe link {cur} below its max {mx}"
                        + (IDLE_NOTE if low_gen and not low_width else ""),
                    )
                )
    return items
