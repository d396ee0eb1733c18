"""The packaged catalog: data-sheet figures, sources, lookups, MIG geometries, XID codes.

Expected values are written by hand from the foundation issue's table (dense TFLOP/s), the
vendors' data sheets, NVIDIA's MIG User Guide and the real H200 captures under tests/fixtures.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.catalog import Catalog, GpuModel, MigProfile, XidAction, XidSeverity, load_catalog
from gpufleet.errors import UnknownNameError

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-h200"
MiB = 2**20

# key: (BW GB/s, FP64, FP64-TC, FP32, TF32, BF16, FP8, FP4, max W, link kind, link GB/s).
# None = the table gives "-" (no such figure / no such path).
TABLE: dict[str, tuple[float, ...] | tuple[object, ...]] = {
    "a100-sxm4-40gb": (1555, 9.7, 19.5, 19.5, 156, 312, None, None, 400, "nvlink", 600),
    "a100-sxm4-80gb": (2039, 9.7, 19.5, 19.5, 156, 312, None, None, 400, "nvlink", 600),
    "a100-pcie-80gb": (1935, 9.7, 19.5, 19.5, 156, 312, None, None, 300, "bridge", 600),
    "h100-sxm": (3350, 34, 67, 67, 494.5, 989.5, 1979, None, 700, "nvlink", 900),
    "h100-pcie": (2000, 26, 51, 51, 378, 756.5, 1513, None, 350, "bridge", 600),
    "h100-nvl": (3900, 30, 60, 60, 417.5, 835.5, 1670.5, None, 400, "bridge", 600),
    "h200-sxm": (4800, 34, 67, 67, 494.5, 989.5, 1979, None, 700, "nvlink", 900),
    "h200-nvl": (4800, 30, 60, 60, 417.5, 835.5, 1670.5, None, 600, "bridge", 900),
    "b200": (7700, 37, 37, 75, 1100, 2250, 4500, 9000, 1000, "nvlink", 1800),
    "gb200": (8000, 40, 40, 80, 1250, 2500, 5000, 10000, 1200, "nvlink", 1800),
    "l40s": (864, None, None, 91.6, 183, 362, 733, None, 350, "none", None),
    "l4": (300, None, None, 30.3, 60, 121, 242.5, None, 72, "none", None),
    # MI300X link bandwidth: AMD data sheet, 7 Infinity Fabric links x 128 GB/s.
    "mi300x": (5300, None, None, 163.4, None, 1307.4, 2614.9, None, 750, "infinity_fabric", 896),
}
# Marketed memory (GB) and type per model, from the table (a100-pcie-40gb: data sheet).
MEMORY = {
    "a100-sxm4-40gb": (40, "HBM2"),
    "a100-sxm4-80gb": (80, "HBM2e"),
    "a100-pcie-40gb": (40, "HBM2"),
    "a100-pcie-80gb": (80, "HBM2e"),
    "h100-sxm": (80, "HBM3"),
    "h100-pcie": (80, "HBM2e"),
    "h100-nvl": (94, "HBM3"),
    "h200-sxm": (141, "HBM3e"),
    "h200-nvl": (141, "HBM3e"),
    "b200": (180, "HBM3e"),
    "gb200": (186, "HBM3e"),
    "l40s": (48, "GDDR6"),
    "l4": (24, "GDDR6"),
    "mi300x": (192, "HBM3"),
}
# Frame-buffer totals NVML reports (MiB), from nvidia-smi captures named in the brief.
NVML_MIB = {
    "a100-sxm4-40gb": 40960,
    "a100-pcie-40gb": 40960,
    "a100-sxm4-80gb": 81920,
    "a100-pcie-80gb": 81920,
    "h100-sxm": 81559,
    "h100-pcie": 81559,
    "h100-nvl": 95830,
    "h200-sxm": 143771,
    "h200-nvl": 143771,
}
NVML_NAMES = {
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200-sxm",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA B200": "b200",
    "NVIDIA GB200": "gb200",
    "NVIDIA L40S": "l40s",
    "NVIDIA L4": "l4",
}
PCI_IDS = {
    "0x233510DE": "h200-sxm",
    "0x233010DE": "h100-sxm",
    "0x20B010DE": "a100-sxm4-40gb",
    "0x20B210DE": "a100-sxm4-80gb",
    "0x20F110DE": "a100-pcie-40gb",
    "0x20B510DE": "a100-pcie-80gb",
    "0x233110DE": "h100-pcie",
    "0x26B910DE": "l40s",
    "0x27B810DE": "l4",
}


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


# ---------------------------------------------------------------- GPU figures


def test_all_required_models_present(cat: Catalog) -> None:
    assert set(MEMORY) <= set(cat.gpus)


@pytest.mark.parametrize("key", sorted(TABLE))
def test_table_figures(cat: Catalog, key: str) -> None:
    bw, fp64, fp64tc, fp32, tf32, bf16, fp8, fp4, watts, link, link_bw = TABLE[key]
    g = cat.gpus[key]
    assert g.memory_bandwidth_gbps == bw
    t = g.tflops
    for got, want in ((t.fp32, fp32), (t.bf16, bf16), (t.fp8, fp8), (t.fp4, fp4)):
        assert got == want
    if key != "mi300x":  # the table leaves MI300X FP64/TF32 blank; see test_mi300x_datasheet
        assert (t.fp64, t.fp64_tensor, t.tf32) == (fp64, fp64tc, tf32)
    assert t.fp16 == t.bf16  # the table's BF16/FP16 column
    assert g.max_power_w == watts
    assert g.gpu_link.value == link
    assert g.gpu_link_bandwidth_gbps == link_bw


def test_mi300x_datasheet(cat: Catalog) -> None:
    # AMD Instinct MI300X data sheet: FP64 vector 81.7, FP64 matrix 163.4, TF32 653.7 (dense).
    t = cat.gpus["mi300x"].tflops
    assert (t.fp64, t.fp64_tensor, t.tf32) == (81.7, 163.4, 653.7)
    assert cat.gpus["mi300x"].vendor == "amd"
    assert cat.gpus["mi300x"].nvml_names == ()


def test_a100_pcie_40gb_datasheet(cat: Catalog) -> None:
    g = cat.gpus["a100-pcie-40gb"]  # A100 data sheet, 40GB PCIe column
    assert (g.memory_bandwidth_gbps, g.max_power_w, g.tflops.bf16) == (1555, 250, 312)


@pytest.mark.parametrize("key", sorted(MEMORY))
def test_memory(cat: Catalog, key: str) -> None:
    gb, mem_type = MEMORY[key]
    g = cat.gpus[key]
    assert g.memory_type == mem_type
    if key in NVML_MIB:
        assert g.memory_bytes == NVML_MIB[key] * MiB
    # NVML's MiB total is the marketed GB read as GiB, less reserved memory: 1.00-1.08x GB*1e9.
    assert 1.0 <= g.memory_bytes / (gb * 1e9) <= 1.08


def test_fp8_only_from_hopper_and_ada_on(cat: Catalog) -> None:
    for g in cat.gpus.values():
        if g.architecture == "ampere":
            assert g.tflops.fp8 is None, g.key
        if g.architecture != "blackwell":
            assert g.tflops.fp4 is None, g.key


def test_mig_max_instances(cat: Catalog) -> None:
    for key, g in cat.gpus.items():
        expected = 0 if key in ("l40s", "l4", "mi300x") else 7
        assert g.mig_max_instances == expected, key


def test_generations_and_links(cat: Catalog) -> None:
    gens = {"a100-sxm4-80gb": 3, "h100-sxm": 4, "h200-sxm": 4, "b200": 5, "gb200": 5}
    for key, gen in gens.items():
        assert cat.gpus[key].nvlink_generation == gen
    assert cat.gpus["h200-sxm"].pcie_generation == 5
    assert cat.gpus["a100-sxm4-80gb"].pcie_generation == 4
    assert cat.gpus["h100-pcie"].sm_count == 114
    assert cat.gpus["a100-sxm4-40gb"].sm_count == 108


def test_only_h200_has_measured_efficiency(cat: Catalog) -> None:
    with_eff = {k for k, g in cat.gpus.items() if g.efficiency is not None}
    assert with_eff == {"h200-sxm"}
    eff = cat.gpus["h200-sxm"].efficiency
    assert eff is not None
    assert eff.tflops["bf16"] == pytest.approx(792, abs=1)
    assert eff.sustained_bf16_tflops == pytest.approx(662, abs=1)
    # Measured matmuls never exceed the data-sheet peak (FP64 matmuls run on the FP64 tensor
    # cores, so their peak is fp64_tensor: 61.4 measured vs 67).
    for prec, value in eff.tflops.items():
        peak = cat.gpus["h200-sxm"].peak_tflops("fp64_tensor" if prec == "fp64" else prec)
        assert peak is not None and value < peak, prec


# ---------------------------------------------------------------- sources


def test_every_record_has_a_source(cat: Catalog) -> None:
    sources = {f"gpu {k}": g.source for k, g in cat.gpus.items()}
    sources |= {f"system {k}": s.source for k, s in cat.systems.items()}
    sources |= {f"xid {k}": x.source for k, x in cat.xids.items()}
    sources |= {f"mig {k}": m.source for k, m in cat.mig.items()}
    assert len(sources) == len(cat.gpus) + len(cat.systems) + len(cat.xids) + len(cat.mig)
    for what, src in sources.items():
        assert len(src.strip()) > 10, what


def test_per_field_sources_name_real_fields(cat: Catalog) -> None:
    fields = set(GpuModel.model_fields)
    for g in cat.gpus.values():
        for name, src in g.sources.items():
            assert name.split(".")[0] in fields, f"{g.key}: sources.{name} is not a field"
            assert src.strip(), f"{g.key}: empty source for {name}"
        assert g.source_of("memory_bandwidth_gbps") == g.source
    assert "143771" in cat.gpus["h200-sxm"].source_of("memory_bytes")


# ---------------------------------------------------------------- lookups


@pytest.mark.parametrize(("name", "key"), sorted(NVML_NAMES.items()))
def test_lookup_by_nvml_name(cat: Catalog, name: str, key: str) -> None:
    assert cat.gpu_by_nvml_name(name) is cat.gpus[key]
    assert cat.gpu(name).key == key


@pytest.mark.parametrize(("pci", "key"), sorted(PCI_IDS.items()))
def test_lookup_by_pci_id(cat: Catalog, pci: str, key: str) -> None:
    assert pci in cat.gpus[key].pci_device_ids
    # The PCI id wins over a name that does not match (and lower case is accepted).
    found = cat.gpu_by_nvml_name("Some GPU", pci.lower())
    assert found is not None and found.key == key


@pytest.mark.parametrize(
    ("alias", "key"),
    [
        ("h200", "h200-sxm"),
        ("H100", "h100-sxm"),
        ("a100", "a100-sxm4-80gb"),
        ("H100 NVL", "h100-nvl"),
        ("mi300", "mi300x"),
        ("H200_SXM", "h200-sxm"),
    ],
)
def test_lookup_by_alias(cat: Catalog, alias: str, key: str) -> None:
    assert cat.gpu(alias).key == key


def test_nvml_names_and_aliases_unique(cat: Catalog) -> None:
    seen: dict[str, str] = {}
    for g in cat.gpus.values():
        for n in (g.key, *g.aliases, *g.nvml_names, *g.pci_device_ids):
            norm = n.lower().replace(" ", "-")
            assert norm not in seen, f"{n} used by {seen.get(norm)} and {g.key}"
            seen[norm] = g.key


def test_did_you_mean(cat: Catalog) -> None:
    with pytest.raises(UnknownNameError) as info:
        cat.gpu("h10-sxm")
    assert "h100-sxm" in info.value.suggestions
    assert info.value.exit_code == 2
    assert "did you mean" in str(info.value)
    assert cat.find_gpu("h10-sxm") is None


def test_bad_pci_id_rejected() -> None:
    with pytest.raises(ValidationError, match="0x233510DE"):
        GpuModel.model_validate(
            {
                "key": "x",
                "marketing_name": "x",
                "architecture": "x",
                "form_factor": "sxm",
                "memory_bytes": 1,
                "memory_type": "x",
                "memory_bandwidth_gbps": 1,
                "tflops": {},
                "max_power_w": 1,
                "gpu_link": "none",
                "pcie_generation": 4,
                "source": "x",
                "pci_device_ids": ["2335"],
            }
        )


# ---------------------------------------------------------------- systems


@pytest.mark.parametrize(
    ("key", "gpu", "kw", "units", "nics", "gbps"),
    [
        ("dgx-a100", "a100-sxm4-80gb", 6.5, 6, 8, 200),
        ("dgx-h100", "h100-sxm", 10.2, 8, 8, 400),
        ("dgx-h200", "h200-sxm", 10.2, 8, 8, 400),
        ("dgx-b200", "b200", 14.3, 10, 8, 400),
    ],
)
def test_systems(
    cat: Catalog, key: str, gpu: str, kw: float, units: int, nics: int, gbps: int
) -> None:
    s = cat.systems[key]
    assert (s.gpu, s.gpus, s.max_power_kw, s.rack_units) == (gpu, 8, kw, units)
    assert (s.compute_nics, s.compute_nic_gbps) == (nics, gbps)
    assert s.storage_nics >= 1
    assert cat.system(s.name) is s
    assert s in cat.systems_for(gpu)


# ---------------------------------------------------------------- MIG


def _parse_lgip(text: str) -> dict[int, tuple[str, int, float, int]]:
    """profile id -> (name, total instances, memory GiB, SMs) from `nvidia-smi mig -lgip`."""
    row = re.compile(
        r"^\|\s+\d+\s+MIG\s+(\S+)\s+(\d+)\s+\d+/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)\s", re.MULTILINE
    )
    return {int(m[2]): (m[1], int(m[3]), float(m[4]), int(m[5])) for m in row.finditer(text)}


def _parse_lgipp(text: str) -> dict[int, tuple[tuple[int, ...], int]]:
    """profile id -> (placement starts, size) from `nvidia-smi mig -lgipp`."""
    row = re.compile(r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)")
    return {
        int(m[1]): (tuple(int(s) for s in m[2].split(",")), int(m[3])) for m in row.finditer(text)
    }


def test_h200_geometry_matches_real_capture(cat: Catalog) -> None:
    lgip = _parse_lgip((FIXTURES / "nvidia-smi-mig-lgip.txt").read_text())
    lgipp = _parse_lgipp((FIXTURES / "nvidia-smi-mig-lgipp.txt").read_text())
    assert len(lgip) == len(lgipp) == 7
    geom = cat.mig["h200-sxm"]
    assert {p.profile_id for p in geom.profiles} == set(lgip)
    for p in geom.profiles:
        assert p.profile_id is not None, p.name  # captured GPUs know every id
        name, total, gib, sms = lgip[p.profile_id]
        assert p.name == name
        assert p.max_instances == total
        assert p.memory_mib == round(gib * 1024)
        assert p.sm_count == sms
        assert (p.placements, p.placement_size) == lgipp[p.profile_id]


EXPECTED_NAMES = {
    "h200-sxm": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "a100-sxm4-40gb": [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ],
    "a100-sxm4-80gb": [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ],
    "h100-nvl": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
}
EXPECTED_NAMES["a100-pcie-40gb"] = EXPECTED_NAMES["a100-sxm4-40gb"]
for _k in ("a100-pcie-80gb", "h100-sxm", "h100-pcie"):
    EXPECTED_NAMES[_k] = EXPECTED_NAMES["a100-sxm4-80gb"]

# (compute slices, memory slices) -> (profile id, placements, size, max instances), per the
# MIG User Guide; the same on every GPU here. The +me variant shares 1g's row (max 1).
RULES = {
    (1, 1): (19, (0, 1, 2, 3, 4, 5, 6), 1, 7),
    (1, 2): (15, (0, 2, 4, 6), 2, 4),
    (2, 2): (14, (0, 2, 4), 2, 3),
    (3, 4): (9, (0, 4), 4, 2),
    (4, 4): (5, (0,), 4, 1),
    (7, 8): (0, (0,), 8, 1),
}


def test_expected_models_and_names(cat: Catalog) -> None:
    assert set(EXPECTED_NAMES) <= set(cat.mig)
    for key, names in EXPECTED_NAMES.items():
        assert [p.name for p in cat.mig[key].profiles] == names, key


@pytest.mark.parametrize("key", [*sorted(EXPECTED_NAMES), "h200-nvl"])
def test_geometry_rules(cat: Catalog, key: str) -> None:
    geom = cat.mig[key]
    gpu = cat.gpus[key]
    for p in geom.profiles:
        pid, starts, size, max_n = RULES[(p.compute_slices, p.memory_slices)]
        if p.media_extensions:
            assert (p.profile_id, p.max_instances) == (20, 1), p.name
        else:
            assert (p.profile_id, p.max_instances) == (pid, max_n), p.name
        assert (p.placements, p.placement_size) == (starts, size), p.name
        for s in p.placements:
            assert s % p.placement_size == 0
            assert s + p.placement_size <= geom.memory_slices
        assert p.name.startswith(f"{p.compute_slices}g.")
        assert p.memory_mib is not None, p.name  # these models' -lgip figures are known
        assert p.memory_mib * MiB < gpu.memory_bytes
    whole = geom.profile(f"7g.{EXPECTED_NAMES.get(key, EXPECTED_NAMES['h200-sxm'])[-1][3:]}")
    # The whole-GPU instance holds almost all of the frame buffer (>= 97 %).
    assert whole.memory_mib is not None
    assert whole.memory_mib * MiB >= 0.97 * gpu.memory_bytes
    # Two memory slices hold twice one slice's memory, give or take a few hundred MiB.
    one = next(p for p in geom.profiles if p.memory_slices == 1)
    two = next(p for p in geom.profiles if p.memory_slices == 2)
    assert one.memory_mib is not None and two.memory_mib is not None
    assert 1.9 <= two.memory_mib / one.memory_mib <= 2.1


def test_hopper_whole_gpu_sm_count_matches_gpu_record(cat: Catalog) -> None:
    for key in ("h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm"):
        whole = next(p for p in cat.mig[key].profiles if p.compute_slices == 7)
        assert whole.sm_count == cat.gpus[key].sm_count, key


def _fits(profiles: Sequence[MigProfile], slices: int = 8, compute: int = 7) -> bool:
    """Whether these GPU instances can coexist: non-overlapping placements, <= 7 compute slices."""
    if sum(p.compute_slices for p in profiles) > compute:
        return False
    if sum(1 for p in profiles if p.media_extensions) > 1:
        return False
    for starts in itertools.product(*(p.placements for p in profiles)):
        used: set[int] = set()
        ok = True
        for p, s in zip(profiles, starts, strict=True):
            span = set(range(s, s + p.placement_size))
            if span & used or max(span) >= slices:
                ok = False
                break
            used |= span
        if ok:
            return True
    return False


@pytest.mark.parametrize("key", [*sorted(EXPECTED_NAMES), "h200-nvl"])
def test_valid_and_invalid_layouts(cat: Catalog, key: str) -> None:
    geom = cat.mig[key]
    by = {(p.compute_slices, p.memory_slices, p.media_extensions): p for p in geom.profiles}
    g1, g1me, g1x2 = by[(1, 1, False)], by[(1, 1, True)], by[(1, 2, False)]
    g2, g3, g4, g7 = by[(2, 2, False)], by[(3, 4, False)], by[(4, 4, False)], by[(7, 8, False)]
    assert _fits([g1] * 7)
    assert _fits([g3, g4])
    assert _fits([g3, g3])
    assert _fits([g2, g2, g2, g1])
    assert _fits([g4, g2, g1])
    assert _fits([g1x2] * 3 + [g1])
    assert _fits([g1me] + [g1] * 6)
    assert _fits([g7])
    assert not _fits([g1] * 8)
    assert not _fits([g4, g4])
    assert not _fits([g7, g1])
    assert not _fits([g3, g3, g1])
    assert not _fits([g1x2] * 4 + [g1])
    assert not _fits([g1me, g1me])
    # Each profile alone: max_instances copies fit, one more does not (the +me limit is 1).
    for p in geom.profiles:
        assert _fits([p] * p.max_instances), p.name
        assert not _fits([p] * (p.max_instances + 1)), p.name


def test_no_geometry_without_mig(cat: Catalog) -> None:
    for key in ("l40s", "l4", "mi300x"):
        assert cat.mig_geometry(key) is None
    with pytest.raises(UnknownNameError):
        cat.mig["h200-sxm"].profile("1g.5gb")


# ---------------------------------------------------------------- XID

REQUIRED_XIDS = {
    13,
    31,
    43,
    45,
    46,
    48,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    119,
    120,
    136,
    140,
    143,
    *range(144, 151),
    154,
    155,
    156,
    158,
}


def test_xid_codes_present(cat: Catalog) -> None:
    assert set(cat.xids) >= REQUIRED_XIDS
    for code, x in cat.xids.items():
        assert x.code == code
        assert x.name and x.meaning and x.notes


def test_application_level_set(cat: Catalog) -> None:
    app_level = {c for c, x in cat.xids.items() if x.application_level}
    assert app_level == {13, 31, 43, 45, 68, 109}
    for c in app_level:
        assert cat.xids[c].action is XidAction.RESTART_APP
        assert cat.xids[c].severity is not XidSeverity.FAIL


def test_hardware_xids_need_reset_or_more(cat: Catalog) -> None:
    for code in (48, 62, 64, 79, 95, 119, 120, 140, 143):
        x = cat.xid(code)
        assert x is not None
        assert x.severity is XidSeverity.FAIL, code
        assert x.action.rank >= XidAction.RESET_GPU.rank, code
        assert not x.application_level
    assert cat.xids[79].action is XidAction.REBOOT_NODE
    assert cat.xids[64].action is XidAction.DRAIN_AND_INSPECT


def test_specific_xids(cat: Catalog) -> None:
    x63, x92, x94, x74 = cat.xid(63), cat.xid(92), cat.xid(94), cat.xid(74)
    assert x63 is not None and x92 is not None and x94 is not None and x74 is not None
    assert (x63.severity, x63.action) == (XidSeverity.INFO, XidAction.NONE)
    assert "repeat" in x63.notes.lower() or "rate" in x63.notes.lower()
    assert (x92.severity, x92.action) == (XidSeverity.WARN, XidAction.NONE)
    assert x94.action is XidAction.RESTART_APP
    assert "nvlink" in x74.name.lower() and x74.severity is XidSeverity.FAIL
    assert cat.xid(12345) is None


def test_xid_action_order() -> None:
    ranks = [
        a.rank
        for a in (
            XidAction.NONE,
            XidAction.RESTART_APP,
            XidAction.RESET_GPU,
            XidAction.REBOOT_NODE,
            XidAction.DRAIN_AND_INSPECT,
        )
    ]
    assert ranks == sorted(ranks) and len(set(ranks)) == 5
