"""Issue 17 site and topology cases against hand-computed values: shared storage, UPS, generators,
cooling plant, balanced spines, the cable map, and `gpufleet plan` warnings and outputs."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.plan.cablemap import cable_map
from gpufleet.plan.fabric import Fabric, Layout, balanced_spines, fat_tree
from gpufleet.plan.planner import plan
from gpufleet.plan.plant import coolant_litres_per_min_per_kw
from gpufleet.plan.spec import load_spec
from tests.plan.builders import assert_cable_map_matches, fabric, plant, storage

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_multi_node_training_gets_a_parallel_fs_with_capacity() -> None:
    s = storage(training_nodes=128, tokens=1.5e12, checkpoints_kept=3)
    assert s.parallel_fs_recommended and "128 nodes" in s.reason
    # 3 x 980 GB checkpoints + 1.5e12 tokens x 4 bytes = 2.94 TB + 6 TB
    assert s.capacity_bytes == pytest.approx(3 * 980e9 + 6e12)


def test_single_node_needs_no_parallel_fs_unless_fast() -> None:
    args = dict(tokens_per_s=1e5, nodes=1, training_nodes=1)
    assert not storage(parameters=8e9, **args).parallel_fs_recommended
    # 1e12 params x 14 B / 300 s = 46.7 GB/s > 10 GB/s: a parallel FS even on one node
    assert storage(parameters=1e12, **args).parallel_fs_recommended


def test_1024_gpu_pretraining_gets_a_parallel_fs_and_a_bom_line(tmp_path: Path) -> None:
    bom = tmp_path / "bom.csv"
    r = runner.invoke(
        app, ["plan", str(ROOT / "examples" / "training-1024.yaml"), "--bom", str(bom)]
    )
    assert r.exit_code == 0, r.output
    assert "parallel file system" in r.stdout
    rows = list(csv.DictReader(io.StringIO(bom.read_text())))
    assert [x["item"] for x in rows if x["category"] == "storage"] == ["parallel file system"]
    assert any(x["item"] == "UPS" for x in rows)


def test_plant_ups_generator_cdus_and_air() -> None:
    p = plant()
    assert p.ups_kva == pytest.approx(1000 / 0.9)  # 1,111 kVA at pf 0.9
    assert p.ups_systems == 2 and p.ups_installed_kva == pytest.approx(2000 / 0.9)
    assert p.battery_kwh == pytest.approx(1000 * 5 / 60 / 0.95)  # 87.7 kWh
    assert p.generator_kva == pytest.approx(1150 / 0.8)  # 1,437.5 kVA < one 2,500 kVA set
    assert p.generators == 2  # 2N
    # water, dT 10 K: 60 / (4.186 x 10) = 1.433 L/min per kW; 800 kW -> 1,146.8 L/min
    assert coolant_litres_per_min_per_kw(10) == pytest.approx(1.4333, abs=1e-4)
    assert p.liquid_kw == 800 and p.coolant_l_per_min == pytest.approx(800 * 60 / 41.86)
    assert p.cdus == 2  # ceil(800 / 1000) + 1 spare
    # 200 kW to air at dT 12 K: 200 x 3600 / (1.2 x 1.006 x 12) = 49,702 m3/h
    assert p.airflow_m3_per_h == pytest.approx(49_702, abs=1)
    n1 = plant(facility_kw=4500, redundancy="N+1", cooling="air", runtime_s=600, battery="vrla")
    # 4,500 / 0.8 = 5,625 kVA over 2,500 kVA sets = 3 (2.25 up) + 1
    assert (n1.generators, n1.cdus, n1.liquid_kw) == (4, 0, 0)
    assert n1.ups_installed_kva == pytest.approx(1000 / 0.9 * 1.25)


def test_spines_divide_each_leafs_uplinks() -> None:
    # 24 leaves x 32 uplinks = 768 links; 12 spines have the ports but 32 / 12 is uneven;
    # 13-15 do not divide 32 either; 16 spines take 2 links from every leaf: 48 of 64 ports
    spines, why = balanced_spines(24, 32, 64)
    assert spines == 16
    assert "12 spines would have enough ports but 32 uplinks do not divide evenly" in why
    t = fat_tree(96, 8, 64)  # 96 nodes x 8 rails: 8 x ceil(96 / 32) = 24 leaves
    assert (t.leaves, t.spines, t.leaf_spine_links) == (24, 16, 768)
    assert balanced_spines(16, 32, 64)[0] == 8  # SuperPOD 2 SU: already balanced


def _fabric(servers: int, per_rack: int = 4) -> tuple[Fabric, Layout]:
    racks = -(-servers // per_rack)
    layout = Layout(racks, per_rack, 12, 0.6, 2.4)
    return fabric(servers, layout, pdus=2 * racks), layout


@pytest.mark.parametrize("servers", [128, 96, 264])  # 4 SU, unbalanced-by-default, 3 levels
def test_cable_map_counts_equal_the_fabric_links(servers: int) -> None:
    f, layout = _fabric(servers)
    cables = cable_map(f, layout, 2 * layout.racks)
    # per stock length the map equals the BOM's cable lines; no port is used twice
    assert_cable_map_matches(f, cables)
    # switch ports stay within the radix
    assert all(int(c.b_port) <= 64 for c in cables if c.network != "out-of-band")


def test_cli_cable_map_and_superpod_examples(tmp_path: Path) -> None:
    out = tmp_path / "cables.csv"
    spec = ROOT / "examples" / "superpod-b200-4su.yaml"
    r = runner.invoke(app, ["plan", str(spec), "--cable-map", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    chosen = next(c for c in doc["candidates"] if c["candidate"] == doc["chosen"])
    # DGX B200 SuperPOD RA, 4 SU: 128 nodes, 32 leaf + 16 spine, 1,024 + 1,024 compute cables
    assert (chosen["fabric"]["compute"]["leaves"], chosen["fabric"]["compute"]["spines"]) == (
        32,
        16,
    )
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    compute = Counter(x["tier"] for x in rows if x["network"] == "compute")
    assert compute == {"node-leaf": 1024, "leaf-spine": 1024}
    assert {"a_device", "a_port", "b_device", "b_port", "length_class", "optic_part"} <= set(
        rows[0]
    )
    sr4 = [x for x in rows if x["optic"] == "400G SR4"]
    assert sr4 and all(x["optic_part"].startswith("MMA4Z00-NS400") for x in sr4)


@pytest.mark.parametrize(
    "name",
    [
        "superpod-h100-1su.yaml",
        "superpod-gb200-nvl72-1su.yaml",
        "hpc-and-rendering.yaml",
        "pilot-pcie.yaml",
    ],
)
def test_superpod_examples_plan(name: str) -> None:
    result = plan(load_spec((ROOT / "examples" / name).read_text(), name))
    assert result.best and result.best.feasible


def test_budget_overrun_exits_1_and_bad_input_2(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "candidates: [h100-sxm]\nworkloads: [{kind: gpus, gpus: 16}]\n"
        "constraints: {rack_power: 40 kW, budget: 500000 USD}\nprices: {server: 300000 USD}\n"
    )
    r = runner.invoke(app, ["plan", str(spec)])
    assert r.exit_code == 1, r.output
    assert "warning:" in r.stdout and "exceeds the budget 500,000 USD" in r.stdout
    j = runner.invoke(app, ["plan", str(spec), "--json"])
    assert j.exit_code == 1
    chosen = json.loads(j.stdout)["candidates"][0]
    assert chosen["warnings"] and chosen["cost"]["within_budget"] is False
    spec.write_text(spec.read_text().replace("500000 USD", "700000 USD"))
    assert runner.invoke(app, ["plan", str(spec)]).exit_code == 0
    spec.write_text(spec.read_text().replace("40 kW", "40 kV"))
    bad = runner.invoke(app, ["plan", str(spec)])
    assert bad.exception is not None and getattr(bad.exception, "exit_code", None) == 2


def test_html_has_plant_storage_and_elevations(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    r = runner.invoke(
        app, ["plan", str(ROOT / "examples" / "training-1024.yaml"), "--html", str(html)]
    )
    assert r.exit_code == 0, r.output
    page = html.read_text()
    for title in ("UPS, generators and cooling plant", "Shared storage", "Rack elevations"):
        assert f"<h2>{title}</h2>" in page
    # 128 DGX B200 at 2 per rack (30.6 kW... see the plan): every compute rack appears by name
    assert "rack001-" in page and "<script" not in page


def test_management_nodes_per_su_join_in_band_oob_power_and_bom(tmp_path: Path) -> None:
    spec = ROOT / "examples" / "superpod-h100-1su.yaml"
    best = plan(load_spec(spec.read_text(), spec.name)).best
    assert best and best.fabric and best.facility
    # 32 DGX H100 = 1 SU x 4 management nodes
    assert best.management_nodes == 4
    assert best.fabric.inband.nodes == 32 + 4
    assert best.fabric.compute.endpoint_links == 256  # the compute fabric is unchanged
    switches_kw = best.fabric.data_switches * 1.5
    assert best.facility.it_kw == pytest.approx(32 * 10.2 + switches_kw + 4 * 1.0)
    cables = cable_map(best.fabric, best.layout, best.facility.pdus)  # type: ignore[arg-type]
    mgmt = [c for c in cables if c.a_device.startswith("mgmt")]
    assert Counter(c.network for c in mgmt) == {"in-band": 4, "out-of-band": 4}
    bom = tmp_path / "bom.csv"
    assert runner.invoke(app, ["plan", str(spec), "--bom", str(bom)]).exit_code == 0
    rows = list(csv.DictReader(io.StringIO(bom.read_text())))
    assert [x["quantity"] for x in rows if x["item"] == "management node"] == ["4"]
