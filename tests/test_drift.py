"""Drift: mixed versions within a node and across nodes of a model; PCIe links below max."""

from __future__ import annotations

from dataclasses import replace

from gpufleet.devices.drift import find_drift
from gpufleet.devices.types import DeviceInfo, NodeInventory


def gpu(i: int, **kw: object) -> DeviceInfo:
    base = DeviceInfo(
        index=i,
        uuid=f"GPU-{i}",
        name="NVIDIA H100 80GB HBM3",
        model="h100-sxm",
        driver_version="550.54.15",
        vbios_version="96.00.99.00.01",
        cuda_driver_version="12.4",
        inforom_version="G520.0200.00.05",
        pcie_gen_current=5,
        pcie_gen_max=5,
        pcie_width_current=16,
        pcie_width_max=16,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def node(name: str, gpus: list[DeviceInfo]) -> NodeInventory:
    return NodeInventory(name=name, gpus=tuple(gpus))


def test_clean_fleet_has_no_drift() -> None:
    assert (
        find_drift([node("a", [gpu(i) for i in range(8)]), node("b", [gpu(i) for i in range(8)])])
        == []
    )


def test_vbios_mixed_within_a_node() -> None:
    gpus = [gpu(i) for i in range(8)]
    gpus[6] = gpu(6, vbios_version="96.00.99.00.00")
    items = find_drift([node("a", gpus)])
    assert len(items) == 1
    item = items[0]
    assert (item.scope, item.field, item.expected) == ("node", "vbios_version", "96.00.99.00.01")
    assert item.values["96.00.99.00.00"] == ["a/6"]


def test_driver_mixed_across_nodes_of_a_model() -> None:
    nodes = [node(n, [gpu(i) for i in range(2)]) for n in ("a", "b", "c")]
    nodes[2] = node("c", [gpu(i, driver_version="535.161.08") for i in range(2)])
    items = find_drift(nodes)
    assert [(i.scope, i.field) for i in items] == [("fleet", "driver_version")]
    assert items[0].expected == "550.54.15"
    assert items[0].values["535.161.08"] == ["c/0", "c/1"]


def test_different_models_are_not_compared() -> None:
    a = node("a", [gpu(0)])
    b = node("b", [gpu(0, model="h200-sxm", name="NVIDIA H200", vbios_version="96.00.A5.00.1A")])
    assert find_drift([a, b]) == []


def test_pcie_links_below_max() -> None:
    items = find_drift(
        [node("a", [gpu(0), gpu(1, pcie_gen_current=4), gpu(2, pcie_width_current=8)])]
    )
    assert [(i.kind, next(iter(i.values.values()))) for i in items] == [
        ("pcie_link", ["a/1"]),
        ("pcie_link", ["a/2"]),
    ]
    assert "Gen4 x16 below its max Gen5 x16" in items[0].message and "idle" in items[0].message
    assert "Gen5 x8" in items[1].message and "idle" not in items[1].message
