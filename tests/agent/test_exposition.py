"""/metrics content: dcgm-exporter names, labels and units; unsupported fields skipped;
`promtool check metrics` accepts the output."""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from gpufleet.devices.sim import Fault, FaultKind, Load, ManualClock, SimNode
from gpufleet.telemetry.exposition import AgentCollector, HealthView, make_registry, render_text
from gpufleet.telemetry.metrics import MIG_COLUMNS
from gpufleet.telemetry.ring import RingBuffer
from gpufleet.telemetry.sampler import MigInstance, Sampler
from tests.agent.conftest import need_binary, sim_node

_LINE = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\} (\S+)$")


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _LINE.match(line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def _exposition(node: SimNode, clock: ManualClock, ticks: int, hostname: str = "h") -> str:
    """The agent's exposition of ``node`` (as ``hostname``) after ``ticks`` samples one second
    apart on ``clock``."""
    s = Sampler(node.backend(), clock=clock)
    for _ in range(ticks):
        s.tick()
        clock.advance(1)
    text = render_text(make_registry(AgentCollector(s, hostname=hostname))).decode()
    s.close()
    return text


@pytest.fixture
def scraped() -> Iterator[tuple[str, Sampler, SimNode]]:
    clock = ManualClock()
    fleet, node = sim_node("1x2xh200", clock)
    node.gpus[0].run(Load(util=1.0, fb_used_bytes=10 * 2**30))
    fleet.inject(Fault(FaultKind.XID, gpu=1, at_s=0.5, params={"xid": 13}))
    fleet.inject(Fault(FaultKind.XID, gpu=1, at_s=1.5, params={"xid": 13}))
    fleet.inject(Fault(FaultKind.XID, gpu=1, at_s=2.5, params={"xid": 31}))
    s = Sampler(node.backend(), clock=clock)
    for _ in range(31):  # 30 s: the load reaches the power cap
        s.tick()
        clock.advance(1)
    s.tick()
    collector = AgentCollector(
        s, hostname="node-a", health=lambda: HealthView(node=1, gpus={0: 0, 1: 1})
    )
    text = render_text(make_registry(collector)).decode()
    yield text, s, node
    s.close()


def test_dcgm_names_labels_and_units(scraped: tuple[str, Sampler, SimNode]) -> None:
    text, s, node = scraped
    rows = parse(text)
    by = {
        (n, lab.get("gpu")): (lab, v)
        for n, lab, v in rows
        if "xid" not in lab and "reason" not in lab
    }
    lab, used_mib = by[("DCGM_FI_DEV_FB_USED", "0")]
    info = s.gpus[0].info
    assert info is not None
    assert lab["UUID"] == info.uuid and lab["pci_bus_id"] == info.pci_bus_id
    assert lab["device"] == "nvidia0" and lab["modelName"] == "NVIDIA H200"
    assert lab["Hostname"] == "node-a" and lab["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
    assert list(lab)[:5] == ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
    # FB in MiB: the simulator reports 615 MiB idle use + the 10 GiB load (gpu.py)
    assert used_mib == 615 + 10 * 1024
    # power in W: under a full load the GPU sits at its 700 W limit (H200 trace)
    assert by[("DCGM_FI_DEV_POWER_USAGE", "0")][1] == pytest.approx(700, abs=15)
    assert by[("DCGM_FI_DEV_GPU_UTIL", "0")][1] == 100 and by[("DCGM_FI_DEV_GPU_UTIL", "1")][1] == 0
    assert by[("DCGM_FI_DEV_SM_CLOCK", "1")][1] == 345  # idle clock (MHz)
    energy = by[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0")][1]
    assert energy == node.gpus[0].state.energy_mj // 1 or energy > 1e6  # mJ counter
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text  # dcgm names kept exactly
    assert by[("gpufleet_gpu_health_status", "1")][1] == 1
    assert ("gpufleet_node_health_status", None) in by and by[
        ("gpufleet_node_health_status", None)
    ][1] == 1


def test_unsupported_metrics_are_skipped_not_zero(scraped: tuple[str, Sampler, SimNode]) -> None:
    text, _, _ = scraped
    # Hopper answers NotSupported for retired pages: no sample at all, not a fake 0
    assert "DCGM_FI_DEV_RETIRED" not in text


def test_gpm_profiling_metrics_from_nvml(scraped: tuple[str, Sampler, SimNode]) -> None:
    """DCGM_FI_PROF_* from NVML GPM: the busy bf16 GPU against the H200 probe's ratios
    (99.8 % graphics, 93.6 % tensor, 17.3 % DRAM under a bf16 matmul), the idle GPU at 0."""
    text, _, _ = scraped
    rows = {(n, lab["gpu"]): v for n, lab, v in parse(text) if n.startswith("DCGM_FI_PROF_")}
    assert rows[("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0")] == pytest.approx(1.0, abs=0.01)
    assert rows[("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0")] == pytest.approx(0.936, abs=0.01)
    assert rows[("DCGM_FI_PROF_DRAM_ACTIVE", "0")] == pytest.approx(0.173, abs=0.01)
    assert rows[("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "1")] == 0.0


def test_no_gpm_on_ampere() -> None:
    clock = ManualClock()
    _, node = sim_node("1x1xa100-sxm4-80gb", clock)
    text = _exposition(node, clock, ticks=3)
    assert "DCGM_FI_DEV_GPU_UTIL" in text
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in text


def test_xid_counter_per_code_and_last_xid_gauge(scraped: tuple[str, Sampler, SimNode]) -> None:
    text, _, _ = scraped
    rows = parse(text)
    xids = {lab["xid"]: v for n, lab, v in rows if n == "gpufleet_xid_errors_total"}
    assert xids == {"13": 2.0, "31": 1.0}  # two XID 13 and one XID 31 were injected
    last = {lab["gpu"]: v for n, lab, v in rows if n == "DCGM_FI_DEV_XID_ERRORS"}
    assert last == {"0": 0.0, "1": 31.0}  # dcgm-exporter semantics: the last code
    reasons = {
        (lab["gpu"], lab["reason"]): v
        for n, lab, v in rows
        if n == "gpufleet_clock_event_reason_active"
    }
    assert reasons[("0", "sw_power_cap")] == 1.0  # loaded GPU held at its power limit (0x4)
    assert reasons[("1", "idle")] == 1.0 and reasons[("1", "sw_power_cap")] == 0.0


def test_mig_instances_carry_profile_labels() -> None:
    clock = ManualClock()
    _fleet, node = sim_node("1x1xh100", clock)
    s = Sampler(node.backend(), clock=clock)
    s.tick()
    ring = RingBuffer(MIG_COLUMNS, 4)
    row = np.full(len(MIG_COLUMNS), math.nan)
    row[MIG_COLUMNS.index("mem_used_bytes")] = 3 * 2**20
    ring.append(clock(), row)
    s.gpus[0].mig.append(MigInstance(gi_id=5, profile="1g.10gb", ring=ring))
    rows = parse(render_text(make_registry(AgentCollector(s))).decode())
    mig = [(lab, v) for n, lab, v in rows if n == "DCGM_FI_DEV_FB_USED" and "GPU_I_ID" in lab]
    assert len(mig) == 1
    lab, v = mig[0]
    assert v == 3 and lab["GPU_I_PROFILE"] == "1g.10gb" and lab["GPU_I_ID"] == "5"
    assert list(lab).index("GPU_I_PROFILE") == 5  # after modelName, before Hostname
    s.close()


def test_no_registration_at_import() -> None:
    from prometheus_client import REGISTRY

    import gpufleet.telemetry.exposition  # noqa: F401

    names = {m.name for m in REGISTRY.collect()}
    assert not any(n.startswith(("DCGM_", "gpufleet_")) for n in names)


# Lint complaints that come from keeping dcgm-exporter's own names and labels unchanged.
_DCGM_LINT = ("camelCase", 'should have "_total" suffix', "should not include type")


@pytest.mark.process
def test_promtool_check_metrics(scraped: tuple[str, Sampler, SimNode]) -> None:
    promtool = need_binary("promtool")
    text, _, _ = scraped
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode in (0, 3), proc.stderr  # 1 would be a parse error
    problems = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    unexpected = [ln for ln in problems if not any(k in ln for k in _DCGM_LINT)]
    assert unexpected == []
    # our own metrics only inherit the camelCase labels (UUID, modelName, ...), nothing else
    ours = [ln for ln in problems if ln.startswith("gpufleet_")]
    assert all("camelCase" in ln for ln in ours)


def test_mig_instances_discovered_through_nvml(tmp_path: object) -> None:
    """A simulated H200 in MIG mode (3g.71gb + 4g.71gb): each GPU instance is found through
    nvmlDeviceGetMigDeviceHandleByIndex and exported with GPU_I_PROFILE/GPU_I_ID labels."""
    import pathlib

    from gpufleet.devices.sim import SimFleet, parse_fleet_spec

    f = pathlib.Path(str(tmp_path)) / "fleet.yaml"
    f.write_text("nodes: [{name: m, model: h200, gpus: 1, mig_layout: [3g.71gb, 4g.71gb]}]\n")
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(str(f)), clock=clock)
    node = fleet.node("m")
    node.gpus[0].run(Load(util=1.0, fb_used_bytes=20 * 2**30))
    text = _exposition(node, clock, ticks=4)
    rows = [(n, lab, v) for n, lab, v in parse(text) if "GPU_I_ID" in lab]
    profiles = {(lab["GPU_I_ID"], lab["GPU_I_PROFILE"]) for _, lab, _ in rows}
    assert profiles == {("1", "3g.71gb"), ("2", "4g.71gb")}
    active = {lab["GPU_I_ID"]: v for n, lab, v in rows if n == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert active == {"1": pytest.approx(1.0, abs=0.01), "2": pytest.approx(1.0, abs=0.01)}
    fb_total = {
        lab["GPU_I_ID"]: v
        for n, lab, v in rows
        if n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    }
    assert set(fb_total) == {"1", "2"}


def _mig_scrape(tmp_path: object) -> list[tuple[str, dict[str, str], float]]:
    """One simulated node: GPU 0 an H200 in MIG mode (3g.71gb + 4g.71gb) under load, GPU 1 the
    same model without MIG."""
    import pathlib

    from gpufleet.devices.sim import SimFleet, parse_fleet_spec

    f = pathlib.Path(str(tmp_path)) / "fleet.yaml"
    f.write_text(
        "nodes: [{name: m, model: h200, gpus: 1, mig_layout: [3g.71gb, 4g.71gb]},"
        " {name: p, model: h200, gpus: 1}]\n"
    )
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(str(f)), clock=clock)
    rows: list[tuple[str, dict[str, str], float]] = []
    for name in ("m", "p"):
        node = fleet.node(name)
        node.gpus[0].run(Load(util=1.0, fb_used_bytes=20 * 2**30))
        rows += parse(_exposition(node, clock, ticks=4, hostname=name))
    return rows


def test_mig_metrics_follow_dcgm_semantics(tmp_path: object) -> None:
    """On a MIG GPU: utilisation NVML does not supply there is absent (not 0); instance-scoped
    metrics are per GPU instance only, device-scoped ones once per GPU, so a sum over a GPU's
    series counts nothing twice. The MIG-less GPU beside it keeps every whole-GPU series."""
    rows = _mig_scrape(tmp_path)
    mig = [(n, lab, v) for n, lab, v in rows if lab["Hostname"] == "m"]
    plain = [(n, lab, v) for n, lab, v in rows if lab["Hostname"] == "p"]
    names_mig = {n for n, _, _ in mig}
    assert "DCGM_FI_DEV_GPU_UTIL" not in names_mig
    assert "DCGM_FI_DEV_MEM_COPY_UTIL" not in names_mig
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"} <= {n for n, _, _ in plain}
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        series = [lab for n, lab, _ in mig if n == name]
        assert sorted(lab.get("GPU_I_ID", "whole GPU") for lab in series) == ["1", "2"], name
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"):
        series = [lab for n, lab, _ in mig if n == name]
        assert len(series) == 1 and "GPU_I_ID" not in series[0], name
    # every GPU_I_* series has both labels; free + used over the instances = their memory
    used = sum(v for n, _, v in mig if n == "DCGM_FI_DEV_FB_USED")
    free = sum(v for n, _, v in mig if n == "DCGM_FI_DEV_FB_FREE")
    assert all("GPU_I_PROFILE" in lab for _, lab, _ in mig if "GPU_I_ID" in lab)
    assert used + free == pytest.approx(2 * 71424, abs=4)  # 3g.71gb + 4g.71gb (catalog MiB)


# dcgm-exporter's default counter set: the uncommented rows of etc/default-counters.csv at
# NVIDIA/dcgm-exporter commit d5e5f510a1b6b393f39a43293ccd9dc985defc79 (May 2026).
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
# Commented out there (off by default) but supplied by NVML, so exported here too.
DCGM_OPTIONAL_EXPORTED = (
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
)
# Default counters not exported, and why.
NOT_EXPORTED = {
    # nvmlDeviceGetGridLicensableFeatures: isGridLicenseSupported 0 on the real H200
    # (tests/fixtures/nvidia-h200/nvml_probe.json); only a vGPU guest has a license status.
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU guests only",
    # NVLink counters are the NVLink exporter's (issue 14 item 2), exported or not here.
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "NVLink series",
}


def test_exported_names_cover_dcgm_exporter_defaults() -> None:
    from gpufleet.telemetry import metrics as M

    exported = {m.name for m in M.DCGM_METRICS} | {M.XID_GAUGE}
    missing = [n for n in DCGM_DEFAULT_COUNTERS if n not in exported and n not in NOT_EXPORTED]
    assert missing == []
    assert set(DCGM_OPTIONAL_EXPORTED) <= exported
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in exported
    # nothing else under a DCGM name, except DCGM_FI_DEV_POWER_USAGE_INSTANT (a DCGM field,
    # NVIDIA/DCGM dcgm_fields.h, that dcgm-exporter exports when a counters file lists it)
    known = set(DCGM_DEFAULT_COUNTERS) | set(DCGM_OPTIONAL_EXPORTED)
    extra = {n for n in exported if n.startswith("DCGM_") and n not in known}
    assert extra <= {"DCGM_FI_DEV_POWER_USAGE_INSTANT"} | {
        n for n in extra if n.startswith("DCGM_FI_DEV_NVLINK")
    }
