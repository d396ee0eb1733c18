"""Layouts from the catalog's geometry and demand parsing (expected values worked by hand from
the NVIDIA MIG User Guide placement tables as carried in catalog/data/mig.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.errors import ConfigError, ParseError, UnknownNameError
from gpufleet.mig.demand import load_demand_file, parse_demand, parse_mix
from gpufleet.mig.layouts import Placement, layout_for_counts, layout_space, validate_placements

H200 = ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]


@pytest.mark.parametrize(
    ("counts", "valid"),
    [
        ({"1g.18gb": 7}, True),  # slices 0..6, slice 7 stranded
        ({"1g.18gb": 8}, False),  # only 7 start slices and max 7
        ({"4g.71gb": 1, "3g.71gb": 1}, True),  # 4g at 0, 3g at 4: 7 compute slices
        ({"4g.71gb": 2}, False),  # 4g.71gb only at slice 0
        ({"3g.71gb": 2}, True),
        ({"3g.71gb": 2, "1g.18gb": 1}, False),  # memory full
        ({"1g.35gb": 4}, True),  # at 0,2,4,6
        ({"2g.35gb": 3, "1g.35gb": 1}, True),  # 2g at 0,2,4 + 1g.35gb at 6: 7 compute
        ({"2g.35gb": 3, "1g.18gb": 2}, False),  # 8 compute slices
        ({"7g.141gb": 1}, True),
        ({"7g.141gb": 1, "1g.18gb": 1}, False),
        ({"1g.18gb+me": 2}, False),  # max 1 instance
    ],
)
def test_h200_layout_validity(counts: dict[str, int], valid: bool) -> None:
    if valid:
        lay = layout_for_counts("h200", counts)
        assert lay.counts == dict(sorted(counts.items()))
        assert validate_placements(load_catalog().mig["h200-sxm"], list(lay.placements)) == []
    else:
        with pytest.raises(ConfigError, match="not a valid MIG layout"):
            layout_for_counts("h200", counts)


def test_every_enumerated_layout_passes_the_independent_checker() -> None:
    geo = load_catalog().mig["h100-sxm"]
    space = layout_space("h100-sxm")
    assert space[0].empty
    assert len({lay.key for lay in space}) == len(space)
    for lay in space:
        assert validate_placements(geo, list(lay.placements)) == []


def test_mig_parted_balanced_config_is_in_the_space() -> None:
    # mig-parted's default config "all-balanced" for H100 80GB: 2x1g.10gb, 1x2g.20gb, 1x3g.40gb
    keys = {lay.key for lay in layout_space("h100-sxm")}
    assert (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)) in keys


def test_checker_reports_overlap_bad_start_and_compute() -> None:
    geo = load_catalog().mig["h200-sxm"]
    problems = validate_placements(
        geo, [Placement(0, 4, "4g.71gb"), Placement(2, 2, "2g.35gb"), Placement(1, 4, "3g.71gb")]
    )
    text = " ".join(problems)
    assert "overlaps" in text
    assert "cannot start at slice 1" in text
    assert "9 compute slices" in text


def test_stranded_slices() -> None:
    lay = layout_for_counts("h200", {"1g.18gb": 7})
    assert (lay.memory_stranded, lay.compute_stranded) == (1, 0)
    lay = layout_for_counts("h200", {"3g.71gb": 2})
    assert (lay.memory_stranded, lay.compute_stranded) == (0, 1)


def test_parse_demand_with_tenants() -> None:
    d = parse_demand("team-a: 6 x 1g.18gb, 1 x 3g.71gb; team-b: 2 x 3g.71gb, 4x1g.35gb", H200)
    assert d.by_tenant() == {
        "team-a": {"1g.18gb": 6, "3g.71gb": 1},
        "team-b": {"3g.71gb": 2, "1g.35gb": 4},
    }
    assert d.totals() == {"1g.18gb": 6, "3g.71gb": 3, "1g.35gb": 4}


def test_parse_demand_did_you_mean() -> None:
    with pytest.raises(UnknownNameError) as err:
        parse_demand("team-a: 6 x 1g.18g", H200)
    assert "1g.18gb" in err.value.suggestions


def test_parse_demand_bad_entry() -> None:
    with pytest.raises(ParseError, match="N x PROFILE"):
        parse_demand("team-a: six of 1g.18gb", H200)
    with pytest.raises(ParseError, match="at least 1"):
        parse_demand("0 x 1g.18gb", H200)


def test_parse_mix() -> None:
    mix = parse_mix("1g.18gb:4, 3g.71gb:1", H200)
    assert mix.totals() == {"1g.18gb": 4, "3g.71gb": 1}
    with pytest.raises(ParseError):
        parse_mix("1g.18gb", H200)


def test_demand_file_and_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text("demand:\n  team-a: {1g.18gb: 6}\n  team-b:\n    3g.71gb: 2\n")
    assert load_demand_file(f, H200).by_tenant() == {
        "team-a": {"1g.18gb": 6},
        "team-b": {"3g.71gb": 2},
    }
    f.write_text("demand:\n  team-a:\n    1g.18gb: 6\n    3g.71gbb: 1\n")
    with pytest.raises(ConfigError, match=r"line 4: demand.team-a.3g.71gbb") as err:
        load_demand_file(f, H200)
    assert "3g.71gb" in str(err.value)
    f.write_text("demand:\n  team-a:\n    1g.18gb: many\n")
    with pytest.raises(ParseError, match="line 3"):
        load_demand_file(f, H200)
