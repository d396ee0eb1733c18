"""Blackwell MIG geometries (B200, GB200) and the media-extension (+me) limit.

Expected figures are typed in from the sources, not read back from the catalog:

- B200: NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles,
  https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html,
  table "GPU Instance Profiles on B200" (B200 180 GB product).
- GB200: NVIDIA GPU Operator default-mig-parted-config
  (github.com/NVIDIA/gpu-operator, assets/state-mig-manager/0400_configmap.yaml): the
  ``all-<profile>`` entries give each profile's count on a whole GPU; the guide's Supported GPUs
  table gives GB200 186GB, 7 instances at most. The stored guide has no GB200 profile table.
- A100 / H100 engines: the same guide page, tables "GPU Instance Profiles on A100" / "on H100".
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.catalog.models import MigGeometry, MigProfile
from gpufleet.cli.app import app
from gpufleet.errors import ConfigError
from gpufleet.mig.demand import parse_demand
from gpufleet.mig.fleet import parse_gpus
from gpufleet.mig.layouts import Placement, layout_for_counts, validate_placements
from gpufleet.mig.planner import plan_exact, plan_first_fit

runner = CliRunner()

# Guide, "GPU Instance Profiles on B200": name -> (Fraction of SMs as sevenths, Fraction of
# Memory as eighths, Number of Instances, Copy Engines, NVDEC, JPEG, OFA). "Full" = 7/7 and 8/8.
B200_GUIDE = {
    "1g.23gb": (1, 1, 7, 2, 1, 1, 0),
    "1g.23gb+me": (1, 1, 1, 2, 1, 1, 1),
    "1g.45gb": (1, 2, 4, 2, 1, 1, 0),
    "2g.45gb": (2, 2, 3, 3, 1, 1, 0),
    "3g.90gb": (3, 4, 2, 6, 1, 1, 0),
    "4g.90gb": (4, 4, 1, 8, 1, 1, 0),
    "7g.180gb": (7, 8, 1, 16, 1, 1, 1),
}

# GPU Operator config: all-1g.23gb 7, all-1g.23gb.me 1 ("GB200, B200"), all-1g.47gb 4,
# all-2g.47gb 3, all-3g.93gb 2, all-4g.93gb 1, all-7g.186gb 1; slices from the name's "Ng." and
# memory eighths (186 GB / 8 ~ 23 GB).
GB200_COUNTS = {
    "1g.23gb": (1, 1, 7),
    "1g.23gb+me": (1, 1, 1),
    "1g.47gb": (1, 2, 4),
    "2g.47gb": (2, 2, 3),
    "3g.93gb": (3, 4, 2),
    "4g.93gb": (4, 4, 1),
    "7g.186gb": (7, 8, 1),
}


def _catalog_json(model: str) -> dict[str, object]:
    result = runner.invoke(app, ["catalog", "mig", model, "--json"])
    assert result.exit_code == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_catalog_mig_b200_lists_the_guide_table() -> None:
    doc = _catalog_json("B200")
    assert doc["model"] == "b200"
    profiles = doc["profiles"]
    assert isinstance(profiles, list)
    assert [p["name"] for p in profiles] == list(B200_GUIDE)
    for p in profiles:
        sm7, mem8, count, ce, dec, jpeg, ofa = B200_GUIDE[p["name"]]
        got = (p["compute_slices"], p["memory_slices"], p["max_instances"], p["copy_engines"])
        assert got == (sm7, mem8, count, ce), p["name"]
        assert (p["decoders"], p["jpeg"], p["ofa"]) == (dec, jpeg, ofa), p["name"]
        assert p["media_extensions"] is p["name"].endswith("+me")
        # The guide gives no profile id, -lgip MiB, SM count or NVENC for B200: absent, not 0.
        assert p["profile_id"] is None and p["memory_mib"] is None and p["sm_count"] is None
        assert p["encoders"] is None


def test_catalog_mig_b200_table_marks_unknown_figures() -> None:
    result = runner.invoke(app, ["catalog", "mig", "b200"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    row = next(line for line in result.stdout.splitlines() if "7g.180gb" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # profile, id, SM share, memory slices, MiB, SMs, max, placements, CE, DEC, ENC, JPG, OFA
    want = ["7g.180gb", "-", "7/7", "8/8", "-", "-", "1", "{0}:8", "16", "1", "-", "1", "1"]
    assert cells == want
    assert "supported-mig-profiles" in result.stdout
    assert "at most one +me instance per GPU" in result.stdout


def test_catalog_mig_gb200_names_and_counts() -> None:
    doc = _catalog_json("gb200")
    profiles = doc["profiles"]
    assert isinstance(profiles, list)
    assert [p["name"] for p in profiles] == list(GB200_COUNTS)
    for p in profiles:
        assert (p["compute_slices"], p["memory_slices"], p["max_instances"]) == GB200_COUNTS[
            p["name"]
        ]
        # No stored source gives GB200 engine counts or -lgip figures.
        for field in ("copy_engines", "decoders", "jpeg", "ofa", "memory_mib", "sm_count"):
            assert p[field] is None, (p["name"], field)


@pytest.mark.parametrize(
    ("model", "counts"),
    [
        ("b200", {"1g.23gb": 7}),  # 7 x 1 compute, slices 0..6
        ("b200", {"3g.90gb": 2}),  # {0,4}:4 twice = all 8 memory slices, 6 compute
        ("b200", {"4g.90gb": 1, "3g.90gb": 1}),  # 4g@0 + 3g@4: 7 compute, 8 slices
        ("b200", {"1g.23gb+me": 1, "1g.23gb": 6}),  # one +me beside six plain 1g
        ("b200", {"2g.45gb": 3, "1g.23gb": 1}),  # 2g@0,2,4 + 1g@6: 7 compute
        ("gb200", {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),  # the operator's all-balanced
    ],
)
def test_valid_blackwell_layouts(model: str, counts: dict[str, int]) -> None:
    assert layout_for_counts(model, counts).counts == dict(sorted(counts.items()))


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ({"1g.23gb": 8}, "at most 7x 1g.23gb"),
        ({"1g.23gb+me": 2}, "at most 1 media-extension (+me) instance per GPU"),
        ({"3g.90gb": 2, "1g.23gb": 1}, "9 memory slices, the GPU has 8"),  # 4+4+1
        ({"4g.90gb": 1, "3g.90gb": 1, "1g.23gb": 1}, "8 compute slices, the GPU has 7"),
    ],
)
def test_invalid_b200_layouts_say_why(counts: dict[str, int], reason: str) -> None:
    with pytest.raises(ConfigError) as exc:
        layout_for_counts("b200", counts)
    assert "not a valid MIG layout of b200" in exc.value.message
    assert reason in exc.value.message


def test_plan_packs_b200_demand() -> None:
    # 2x 3g.90gb + 2x 4g.90gb: 4g has 1 instance per GPU, so two GPUs, each 4g@0 + 3g@4
    # (7 compute, 8 memory slices: nothing stranded).
    plan = plan_exact(parse_gpus("2xb200"), parse_demand("a: 2 x 3g.90gb, b: 2 x 4g.90gb"))
    assert plan.optimal and plan.unplaced == {}
    assert [r.layout.counts for r in plan.gpus] == [{"3g.90gb": 1, "4g.90gb": 1}] * 2
    assert plan.memory_slices_stranded == 0 and plan.compute_slices_stranded == 0
    # 7x 1g.23gb fill one GPU's 7 compute slices; memory slice 7 has no 1g placement.
    one = plan_exact(parse_gpus("2xb200"), parse_demand("7 x 1g.23gb"))
    assert one.gpus_used == 1 and one.placed_instances == 7 and one.memory_slices_stranded == 1


def test_two_me_instances_go_to_two_gpus() -> None:
    gpus = parse_gpus("2xb200")
    demand = parse_demand("video: 2 x 1g.23gb+me")
    for plan in (plan_exact(gpus, demand), plan_first_fit(gpus, demand)):
        assert plan.placed == {"video": {"1g.23gb+me": 2}}, plan.method
        assert [r.layout.counts.get("1g.23gb+me") for r in plan.gpus] == [1, 1], plan.method


def test_two_me_instances_on_one_gpu_are_refused_with_a_reason() -> None:
    gpus = parse_gpus("1xb200")
    demand = parse_demand("video: 2 x 1g.23gb+me")
    plan = plan_exact(gpus, demand)
    assert plan.placed == {"video": {"1g.23gb+me": 1}}
    assert plan.unplaced == {"video": {"1g.23gb+me": 1}}
    assert any("at most 1 (NVIDIA MIG User Guide" in n for n in plan.notes), plan.notes
    assert plan_first_fit(gpus, demand).placed_instances == 1
    result = runner.invoke(
        app, ["mig", "plan", "--gpus", "1xb200", "--demand", "video: 2 x 1g.23gb+me"]
    )
    assert result.exit_code == 0
    assert "media-extension (+me)" in result.stdout and "unplaced" in result.stdout


def test_me_limit_spans_different_me_profiles() -> None:
    # The guide's A30 table has two +me profiles, 1g.6gb+me and 2g.12gb+me, each "1 (A single
    # 1g/2g profile can include media extensions)"; the A30's one JPEG and one OFA can go to one
    # instance only. Geometry built here from that table (A30 is not in the catalog).
    def prof(name: str, c: int, starts: tuple[int, ...], size: int, me: bool) -> MigProfile:
        return MigProfile(
            name=name,
            compute_slices=c,
            memory_slices=size,
            max_instances=1 if me else 4 // size,
            placements=starts,
            placement_size=size,
            media_extensions=me,
        )

    a30 = MigGeometry(
        model="a30-test",
        memory_slices=4,
        compute_slices=4,
        profiles=(
            prof("1g.6gb", 1, (0, 1, 2, 3), 1, False),
            prof("1g.6gb+me", 1, (0, 1, 2, 3), 1, True),
            prof("2g.12gb", 2, (0, 2), 2, False),
            prof("2g.12gb+me", 2, (0, 2), 2, True),
        ),
        source="test: NVIDIA MIG User Guide, A30 table",
    )
    both = [Placement(0, 1, "1g.6gb+me"), Placement(2, 2, "2g.12gb+me")]
    assert any("media-extension" in p for p in validate_placements(a30, both))
    one = [Placement(0, 1, "1g.6gb+me"), Placement(2, 2, "2g.12gb")]
    assert validate_placements(a30, one) == []


def test_existing_gpus_carry_the_guide_engine_counts() -> None:
    cat = load_catalog()
    # A100 table: 1g.5gb "0 NVDECs /0 JPEG /0 OFA", CE 1; 7g.40gb "5 NVDECs /1 JPEG /1 OFA", CE 7.
    a100 = cat.mig["a100-sxm4-40gb"]
    g1, g7 = a100.profile("1g.5gb"), a100.profile("7g.40gb")
    assert (g1.copy_engines, g1.decoders, g1.jpeg, g1.ofa) == (1, 0, 0, 0)
    assert (g7.copy_engines, g7.decoders, g7.jpeg, g7.ofa) == (7, 5, 1, 1)
    # H100 80GB table: 1g.10gb+me "1 NVDEC /1 JPEG /1 OFA"; 7g.80gb "7 NVDECs /7 JPEG /1 OFA", CE 8.
    h100 = cat.mig["h100-sxm"]
    me, w = h100.profile("1g.10gb+me"), h100.profile("7g.80gb")
    assert (me.decoders, me.jpeg, me.ofa, me.media_extensions) == (1, 1, 1, True)
    assert (w.copy_engines, w.decoders, w.jpeg, w.ofa) == (8, 7, 7, 1)


def test_simulator_memory_falls_back_to_the_slice_share() -> None:
    cat = load_catalog()
    # b200 memory_bytes is 183359 MiB (NVML FB total); 1 of 8 slices: 183359 // 8 = 22919 MiB.
    assert cat.mig["b200"].instance_memory_mib("1g.23gb", cat.gpus["b200"].memory_bytes) == 22919
    # With a captured figure (H200 -lgip: 16.00 GiB) the catalog's own value wins.
    h200 = cat.mig["h200-sxm"]
    assert h200.instance_memory_mib("1g.18gb", cat.gpus["h200-sxm"].memory_bytes) == 16384
