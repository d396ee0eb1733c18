"""Issue 31 (planner part) against hand-computed values: gensets sized from the load with standard
ratings, cooling that follows the catalog system (and a warning against it), rack weight and floor
loading.

Figures used by hand: DGX H100 10.2 kW and 130.45 kg, DGX B200 14.3 kW (NVIDIA datasheets);
empty 600 x 1200 mm enclosure 134.09 kg (APC NetShelter SX AR3300); gensets loaded to at most 80 %
of their standby rating, in the standard steps 20, 30, 40, ... 2,500, 2,750, 3,000 kW.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.plan.bom import bom_rows
from gpufleet.plan.planner import CandidatePlan, plan
from gpufleet.plan.plant import size_generators
from gpufleet.plan.report_html import render_html
from gpufleet.plan.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _best(spec: dict[str, Any]) -> CandidatePlan:
    best = plan(load_spec(spec)).best
    assert best is not None and best.facility and best.plant
    return best


def _gpus(candidate: str, gpus: int, **constraints: Any) -> dict[str, Any]:
    return {
        "candidates": [candidate],
        "workloads": [{"kind": "gpus", "gpus": gpus}],
        "constraints": constraints,
    }


def test_pilot_8gpu_gets_20_kw_gensets_and_a_building_backup_note() -> None:
    text = (ROOT / "examples" / "pilot-8gpu.yaml").read_text()
    best = plan(load_spec(text, "pilot-8gpu.yaml")).best
    assert best and best.facility and best.plant
    # one DGX H100 (10.2 kW), no fabric switches for one node, PUE 1.5 (air default):
    # 15.3 kW facility = 19.1 kVA at pf 0.8; at most 80 % loaded: 15.3 / 0.8 = 19.1 kW of rating
    # -> the smallest standard set, 20 kW; 2N -> 2 sets (never the old 2 x 2,000 kW)
    assert best.facility.facility_kw == pytest.approx(15.3)
    assert best.plant.generator_kva == pytest.approx(15.3 / 0.8)
    assert (best.plant.generators, best.plant.generator_unit_kw) == (2, 20.0)
    # 15.3 kW is under the 100 kW retail-colocation threshold: the plan says who has the genset
    assert any("under 100 kW" in n and "provider's" in n for n in best.notes)
    assert best.warnings == ()


def test_1024_b200_gensets_by_hand_and_user_size_wins() -> None:
    base = _gpus(
        "dgx-b200", 1024, rack_power="40 kW", pue=1.15, redundancy="2N", switch_power="0 kW"
    )
    best = _best(base)
    # 1,024 / 8 = 128 DGX B200 x 14.3 kW = 1,830.4 kW IT (switch power zeroed) x 1.15 = 2,104.96 kW
    assert best.facility.facility_kw == pytest.approx(2104.96)  # type: ignore[union-attr]
    # / 0.8 = 2,631.2 kW of rating: one 2,750 kW set (2,500 is too small); 2N -> 2 sets
    p = best.plant
    assert p is not None
    assert (p.generators, p.generator_unit_kw) == (2, 2750.0)
    assert p.generator_required_kw == pytest.approx(2631.2)
    # N+1: the same set plus one spare
    n1 = _best({**base, "constraints": {**base["constraints"], "redundancy": "N+1"}}).plant
    assert n1 is not None and (n1.generators, n1.generator_unit_kw) == (2, 2750.0)
    # a user-set size wins: 2,631.2 / 1,000 = 2.6 -> 3 sets, doubled for 2N
    own = _best({**base, "constraints": {**base["constraints"], "generator_size": "1000 kW"}})
    assert own.plant is not None
    assert (own.plant.generators, own.plant.generator_unit_kw) == (6, 1000.0)
    assert own.plant.generator_unit_basis == "constraints.generator_size"
    assert not any("under 100 kW" in n for n in best.notes)  # a 2 MW site has its own plant


def test_gensets_above_the_largest_rating_run_in_parallel() -> None:
    # 4,209.92 kW (256 DGX B200 at PUE 1.15) / 0.8 = 5,262.4 kW: over one 3,000 kW set, so 2 sets
    # of at least 2,631.2 kW -> 2,750 kW each; N+1 -> 3
    assert size_generators(4209.92, "N+1") == (2750.0, 3, "smallest standard standby rating")
    # 40 kW / 0.8 = 50 kW: exactly the 50 kW step; N -> 1
    assert size_generators(40.0, "N")[:2] == (50.0, 1)
    assert size_generators(0.0, "2N")[1] == 0  # no load, no gensets


def test_dgx_h100_follows_its_air_cooling_and_forcing_liquid_warns(tmp_path: Path) -> None:
    auto = _best(_gpus("dgx-h100", 64, rack_power="40 kW"))
    assert auto.facility and auto.plant
    # DGX H100 is air-cooled (catalog, NVIDIA DGX H100/H200 User Guide): no CDUs, all heat to air
    assert auto.facility.cooling == "air"
    assert (auto.plant.cdus, auto.plant.liquid_kw) == (0, 0.0)
    assert auto.warnings == ()
    forced = _best(_gpus("dgx-h100", 64, rack_power="40 kW", cooling="liquid"))
    assert forced.facility and forced.facility.cooling == "liquid"  # planned as asked...
    assert [w for w in forced.warnings if "air-cooled" in w and "DGX H100" in w]  # ...and warned
    # text, --json and HTML all carry it; a warning exits 1
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "candidates: [dgx-h100]\nworkloads: [{kind: gpus, gpus: 64}]\n"
        "constraints: {rack_power: 40 kW, cooling: liquid}\n"
    )
    html = tmp_path / "r.html"
    r = runner.invoke(app, ["plan", str(spec), "--html", str(html)])
    assert r.exit_code == 1, r.output
    assert "warning:" in r.stdout and "air-cooled" in r.stdout
    page = html.read_text()
    assert "<h2>Warnings</h2>" in page and "air-cooled" in page
    j = runner.invoke(app, ["plan", str(spec), "--json"])
    assert j.exit_code == 1
    chosen = json.loads(j.stdout)["candidates"][0]
    assert any("air-cooled" in w for w in chosen["warnings"])


def test_liquid_only_gb200_follows_liquid_and_forcing_air_warns() -> None:
    auto = _best(_gpus("dgx-gb200-tray", 72, rack_power="150 kW"))
    assert auto.facility and auto.plant
    assert auto.facility.cooling == "liquid" and auto.plant.cdus >= 2
    assert not any("cooled" in w for w in auto.warnings)
    forced = _best(_gpus("dgx-gb200-tray", 72, rack_power="150 kW", cooling="air"))
    assert [w for w in forced.warnings if "is liquid-cooled" in w]


def test_rack_weight_and_floor_loading_of_dgx_h100_racks(tmp_path: Path) -> None:
    # 40 kW racks: floor(40 / 10.2) = 3 DGX H100 per rack (power-limited; 38U would take 4)
    three = _best(_gpus("dgx-h100", 64, rack_power="40 kW")).facility
    assert three is not None and three.servers_per_rack == 3
    # 3 x 130.45 + 134.09 = 525.44 kg over 0.6 x 1.2 = 0.72 m^2 = 729.8 kg/m^2
    assert three.rack_weight_kg == pytest.approx(525.44)
    assert three.rack_footprint_m2 == pytest.approx(0.72)
    assert three.floor_load_kg_m2 == pytest.approx(525.44 / 0.72)
    # 60 kW racks: 38 // 8 = 4 per rack (space-limited): 4 x 130.45 + 134.09 = 655.89 kg,
    # 910.96 kg/m^2: under the 1,224 kg/m^2 default (TIA-942 12 kPa), over a 900 kg/m^2 floor
    four = _gpus("dgx-h100", 64, rack_power="60 kW")
    ok = _best(four)
    assert ok.facility and ok.facility.rack_weight_kg == pytest.approx(655.89)
    assert not any("floor loading" in w for w in ok.warnings)
    weak = _best({**four, "constraints": {**four["constraints"], "floor_rating_kg_m2": 900}})
    assert [w for w in weak.warnings if "floor loading 911 kg/m^2" in w]
    # shown in --json, HTML and the BOM's rack line
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "candidates: [dgx-h100]\nworkloads: [{kind: gpus, gpus: 64}]\n"
        "constraints: {rack_power: 60 kW}\n"
    )
    j = runner.invoke(app, ["plan", str(spec), "--json"])
    assert j.exit_code == 0, j.output
    fac = json.loads(j.stdout)["candidates"][0]["facility"]
    assert fac["rack_weight_kg"] == pytest.approx(655.89)
    assert fac["floor_load_kg_m2"] == pytest.approx(655.89 / 0.72)
    page = render_html(plan(load_spec(spec.read_text())))
    assert "655.9 kg per full rack" in page and "911 kg/m^2" in page
    rack_line = next(r for r in bom_rows(ok) if r.category == "rack")
    assert "656 kg loaded" in rack_line.detail


def test_unknown_server_weight_leaves_the_figure_absent_with_a_note() -> None:
    best = _best(_gpus("dgx-gb200-tray", 72, rack_power="150 kW"))
    f = best.facility
    assert f is not None
    # NVIDIA publishes no GB200 compute-tray weight: absent, never 0
    assert f.rack_weight_kg is None and f.floor_load_kg_m2 is None
    assert any("rack weight and floor loading not known" in n for n in best.notes)
    assert "rack weight</td><td>not known" in render_html(
        plan(load_spec(_gpus("dgx-gb200-tray", 72, rack_power="150 kW")))
    )


def test_text_summary_shows_rack_weight_and_gensets(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "candidates: [dgx-h100]\nworkloads: [{kind: gpus, gpus: 8}]\n"
        "constraints: {rack_power: 40 kW, redundancy: N}\n"
    )
    bom = tmp_path / "bom.csv"
    r = runner.invoke(app, ["plan", str(spec), "--bom", str(bom)], terminal_width=200)
    assert r.exit_code == 0, r.output
    # one DGX H100: 130.45 + 134.09 = 264.54 kg; 10.2 kW x 1.5 = 15.3 kW -> one 20 kW set (N)
    assert "265 kg per full rack" in r.stdout
    assert "1 x 20 kW gensets" in r.stdout
    rows = list(csv.DictReader(io.StringIO(bom.read_text())))
    gen = [x for x in rows if x["item"] == "standby generator"]
    assert [x["quantity"] for x in gen] == ["1"] and gen[0]["detail"].startswith("20 kW standby")
