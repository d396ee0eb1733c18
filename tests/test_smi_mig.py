"""nvidia-smi mig -lgip / -lgipp parsers on the real H200 captures, and their errors.

Expected values read by hand from tests/fixtures/nvidia-h200/nvidia-smi-mig-lgip(p).txt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.devices.smi import combine_mig_profiles, parse_mig_lgip, parse_mig_lgipp
from gpufleet.errors import ParseError

FIX = Path(__file__).parent / "fixtures" / "nvidia-h200"


@pytest.fixture(scope="module")
def lgip_text() -> str:
    return (FIX / "nvidia-smi-mig-lgip.txt").read_text()


@pytest.fixture(scope="module")
def lgipp_text() -> str:
    return (FIX / "nvidia-smi-mig-lgipp.txt").read_text()


def test_lgip_rows(lgip_text: str) -> None:
    rows = parse_mig_lgip(lgip_text, "lgip.txt")
    assert [r.profile_id for r in rows] == [19, 20, 15, 14, 9, 5, 0]
    assert [r.name for r in rows] == [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]
    assert [r.instances_total for r in rows] == [7, 1, 4, 3, 2, 1, 1]
    assert [r.instances_free for r in rows] == [7, 1, 4, 3, 2, 1, 1]
    assert [r.memory_gib for r in rows] == [16.0, 16.0, 32.5, 32.5, 69.75, 69.75, 140.0]
    assert [r.sm_count for r in rows] == [16, 16, 26, 32, 60, 64, 132]
    seven = rows[-1]
    assert (seven.decoders, seven.encoders) == (7, 0)
    assert (seven.copy_engines, seven.jpeg, seven.ofa) == (8, 7, 1)
    assert rows[1].ofa == 1 and rows[0].ofa == 0  # +me brings the OFA
    assert all(r.gpu == 0 and r.p2p is False for r in rows)


def test_lgipp_rows(lgipp_text: str) -> None:
    rows = parse_mig_lgipp(lgipp_text, "lgipp.txt")
    assert [(r.profile_id, r.starts, r.size) for r in rows] == [
        (19, (0, 1, 2, 3, 4, 5, 6), 1),
        (20, (0, 1, 2, 3, 4, 5, 6), 1),
        (15, (0, 2, 4, 6), 2),
        (14, (0, 2, 4), 2),
        (9, (0, 4), 4),
        (5, (0,), 4),  # "Placement :" spelling
        (0, (0,), 8),
    ]


def test_combined_profiles(lgip_text: str, lgipp_text: str) -> None:
    profiles = combine_mig_profiles(parse_mig_lgip(lgip_text), parse_mig_lgipp(lgipp_text))
    by_name = {p.name: p for p in profiles}
    assert len(profiles) == 7
    p = by_name["1g.35gb"]
    assert (p.profile_id, p.compute_slices, p.memory_slices) == (15, 1, 2)
    assert p.memory_mib == 33280  # 32.50 GiB * 1024
    assert (p.placements, p.placement_size, p.max_instances) == ((0, 2, 4, 6), 2, 4)
    assert by_name["7g.141gb"].memory_mib == 143360  # 140.00 GiB
    assert by_name["3g.71gb"].memory_mib == 71424  # 69.75 GiB
    assert by_name["1g.18gb+me"].media_extensions is True
    assert by_name["1g.18gb"].media_extensions is False
    assert (by_name["4g.71gb"].compute_slices, by_name["4g.71gb"].memory_slices) == (4, 4)


def test_combined_profiles_agree_with_catalog(lgip_text: str, lgipp_text: str) -> None:
    geometry = load_catalog().mig_geometry("h200-sxm")
    assert geometry is not None
    profiles = combine_mig_profiles(parse_mig_lgip(lgip_text), parse_mig_lgipp(lgipp_text))
    assert tuple(profiles) == geometry.profiles


def test_empty_listings() -> None:
    assert parse_mig_lgip("No MIG-enabled devices found.\n") == []
    assert parse_mig_lgipp("No MIG-enabled devices found.\n") == []
    assert combine_mig_profiles([], []) == []


def test_lgip_bad_lines(lgip_text: str) -> None:
    bad_mem = lgip_text.replace("32.50      No     26", "32.5x      No     26")
    with pytest.raises(ParseError) as info:
        parse_mig_lgip(bad_mem, "lgip.txt")
    assert info.value.where == "line 12" and "GiB" in info.value.problem
    with pytest.raises(ParseError, match="line 1"):
        parse_mig_lgip("GPU 0: NVIDIA H200 (UUID: GPU-a9be1d05)\n", "lgip.txt")
    broken_row = lgip_text.replace("MIG 2g.35gb         14", "MIG 2g.35gb         xx")
    with pytest.raises(ParseError, match="line 15"):
        parse_mig_lgip(broken_row, "lgip.txt")


def test_lgipp_bad_lines(lgipp_text: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_mig_lgipp(lgipp_text.replace("{0,2,4}:2", "{0,2,x}:2"), "lgipp.txt")
    assert info.value.where == "line 4"
    with pytest.raises(ParseError, match="line 1"):
        parse_mig_lgipp("Profile 19 somewhere\n", "lgipp.txt")


def test_combine_needs_placements(lgip_text: str, lgipp_text: str) -> None:
    lgipp = [p for p in parse_mig_lgipp(lgipp_text) if p.profile_id != 9]
    with pytest.raises(ParseError, match="profile 9"):
        combine_mig_profiles(parse_mig_lgip(lgip_text), lgipp)
