"""Fabric counts: the DGX B200 SuperPOD reference, exactly, and the fat-tree limits."""

from __future__ import annotations

import pytest

from gpufleet.errors import UsageError
from gpufleet.plan.fabric import Layout, cable_class, fat_tree
from tests.plan.builders import fabric

# NVIDIA DGX SuperPOD B200 reference architecture: SU = 32 nodes, 8 compute NICs, 64-port switches.
SUPERPOD = [  # (SUs, nodes, GPUs, leaves, spines, node-leaf cables, leaf-spine cables)
    (2, 64, 512, 16, 8, 512, 512),
    (4, 128, 1024, 32, 16, 1024, 1024),
    (8, 256, 2048, 64, 32, 2048, 2048),
]


@pytest.mark.parametrize(
    ("su", "nodes", "gpus", "leaf", "spine", "node_leaf", "leaf_spine"), SUPERPOD
)
def test_superpod_reference(
    su: int, nodes: int, gpus: int, leaf: int, spine: int, node_leaf: int, leaf_spine: int
) -> None:
    t = fat_tree(su * 32, 8, 64)
    assert (t.nodes, t.nodes * 8) == (nodes, gpus)
    assert (t.levels, t.leaves, t.spines, t.cores) == (2, leaf, spine, 0)
    assert (t.endpoint_links, t.leaf_spine_links) == (node_leaf, leaf_spine)


def test_two_levels_up_to_k2_over_2_then_three_up_to_k3_over_4() -> None:
    assert fat_tree(256, 8, 64).levels == 2  # 2048 = 64^2/2
    t = fat_tree(264, 8, 64)
    assert t.levels == 3
    full = fat_tree(8192, 8, 64)  # 65,536 = 64^3/4: k pods of k/2 + k/2, (k/2)^2 cores
    assert (full.leaves, full.spines, full.cores) == (2048, 2048, 1024)
    with pytest.raises(UsageError, match="three-level"):
        fat_tree(8193, 8, 64)


def test_single_switch_when_endpoints_fit() -> None:
    t = fat_tree(1, 8, 64)
    assert (t.levels, t.leaves, t.spines, t.leaf_spine_links) == (1, 1, 0, 0)


def test_reach_classes() -> None:
    assert cable_class(3)[0] == "DAC"
    assert cable_class(30)[1] == "400G SR4"
    assert cable_class(50)[2] == "OM4 MPO-12"
    assert cable_class(300)[1] == "400G DR4"
    assert cable_class(1500)[1:] == ("400G FR4", "OS2 duplex LC")
    with pytest.raises(UsageError):
        cable_class(3000)


def test_cables_cover_every_link_once_and_optics_come_in_pairs() -> None:
    f = fabric(128, Layout(64, 2, 12, 0.6, 2.4), pdus=128)
    compute = [c for c in f.cables if c.network == "compute"]
    assert sum(c.count for c in compute if c.tier == "node-leaf") == 1024
    assert sum(c.count for c in compute if c.tier == "leaf-spine") == 1024
    assert all(
        c.transceivers == (2 * c.count if c.medium != "DAC" else 0)
        for c in f.cables
        if c.network != "out-of-band"
    )


def test_big_site_needs_single_mode() -> None:
    # 4,000 racks in rows of 12: the far rows are > 50 m from the central spine row.
    f = fabric(8000, Layout(4000, 2, 12, 0.6, 2.4), pdus=0, storage_nics=0)
    assert any(c.transceiver == "400G DR4" for c in f.cables)
