"""NVLink: per-link counters read through the production NVML backend (field values scoped by
link) on the simulator, the `nvlink` health rule's verdicts (DCGM's thresholds), and the
dcgm-exporter NVLink series on /metrics."""

from __future__ import annotations

import re

import pytest

from gpufleet.devices.sim import Fault, FaultKind, Load, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.health.types import Severity
from gpufleet.telemetry.exposition import AgentCollector, make_registry, render_text
from gpufleet.telemetry.sampler import Sampler

from .rig import Rig, codes, find


def test_backend_reads_every_link_and_the_totals() -> None:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x8xh200", seed=3), clock=clock)
    fleet.inject(Fault(FaultKind.NVLINK_ERRORS, node="sim-00", gpu=5, params={"link": 7}))
    backend = fleet.node("sim-00").backend()
    clock.advance(6.0)  # 600 CRC errors a minute by default: 60 in 6 s
    s = backend.sample(5)
    assert s.nvlink_links is not None and len(s.nvlink_links) == 18  # H200: 18 NVLinks
    link = s.nvlink_links[7]
    assert (link.link, link.active, link.crc_errors, link.replay_errors) == (7, True, 60, 6)
    assert all(x.crc_errors == 0 for x in s.nvlink_links if x.link != 7)
    assert (s.nvlink_crc_flit_errors, s.nvlink_replay_errors, s.nvlink_recovery_errors) == (
        60,
        6,
        0,
    )
    assert backend.sample(0).nvlink_crc_flit_errors == 0


def test_a_gpu_without_nvlink_peers_reports_none_not_zero() -> None:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x1xh200", seed=3), clock=clock)
    s = fleet.node("sim-00").backend().sample(0)
    assert s.nvlink_links is None
    assert s.nvlink_crc_flit_errors is None and s.nvlink_bandwidth_kib is None


def test_crc_errors_warn_and_name_the_link() -> None:
    rig = Rig("1x8xh100-sxm")
    rig.inject(FaultKind.NVLINK_ERRORS, gpu=3, link=11)
    report = rig.run(5)
    f = find(report, "NVLINK_CRC_ERRORS")
    assert (f.severity, f.gpu_index, f.evidence["link"]) == (Severity.WARN, 3, 11)
    assert "NVLink 11" in f.message
    assert f.evidence["per_s"] < 100  # 10/s: below DCGM's 100/s failure line
    assert report.verdict == Severity.WARN
    assert codes(report, 0) == set()


def test_crc_errors_at_100_per_second_fail() -> None:
    rig = Rig("1x8xh100-sxm")
    rig.inject(FaultKind.NVLINK_ERRORS, gpu=1, link=2, rate_per_min=150 * 60)
    f = find(rig.run(5), "NVLINK_CRC_ERRORS")
    assert f.severity == Severity.FAIL and f.evidence["per_s"] >= 100


def test_a_recovery_error_fails_and_sticks() -> None:
    rig = Rig("1x8xh100-sxm")
    rig.inject(FaultKind.NVLINK_ERRORS, gpu=2, link=4, recovery=1, rate_per_min=0.001, at_s=2)
    report = rig.run(5)
    f = find(report, "NVLINK_RECOVERY_ERRORS")
    assert (f.severity, f.sticky, f.evidence["link"]) == (Severity.FAIL, True, 4)
    assert report.verdict == Severity.FAIL


def test_a_link_down_fails() -> None:
    rig = Rig("1x8xh100-sxm")
    rig.inject(FaultKind.NVLINK_ERRORS, gpu=6, link=0, down=True, rate_per_min=0.001)
    f = find(rig.run(3), "NVLINK_DOWN")
    assert (f.severity, f.gpu_index, f.evidence["link"]) == (Severity.FAIL, 6, 0)


def test_clean_links_are_quiet_under_load() -> None:
    rig = Rig("1x8xh100-sxm")
    for g in range(8):
        rig.node.gpus[g].run(Load(util=0.6, nvlink_bytes_per_s=300e9), start_s=rig.clock())
    report = rig.run(5)
    assert not {c for c in codes(report) if c.startswith("NVLINK")}


def test_metrics_export_dcgm_nvlink_series() -> None:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x2xh200", seed=3), clock=clock)
    fleet.inject(Fault(FaultKind.NVLINK_ERRORS, node="sim-00", gpu=1, params={"link": 0}))
    node = fleet.node("sim-00")
    node.gpus[0].run(Load(util=0.5, nvlink_bytes_per_s=100e9), start_s=clock())
    s = Sampler(node.backend(), clock=clock, slow_interval_s=5.0)
    try:
        for _ in range(12):
            s.tick()
            clock.advance(1)
        s.tick()
        text = render_text(make_registry(AgentCollector(s, hostname="h"))).decode()
    finally:
        s.close()
    values: dict[tuple[str, str], float] = {}
    for m in re.finditer(r'^(DCGM_FI_DEV_NVLINK_\w+)\{gpu="(\d)".*\} (\S+)$', text, re.M):
        values[(m.group(1), m.group(2))] = float(m.group(3))
    names = {n for n, _ in values}
    assert names == {
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    }
    assert values[("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "1")] > 0
    assert values[("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "0")] == 0
    # GPU 0 moved 100 GB/s each way until the last slow-tier read at 10 s: TX + RX in KiB
    kib = values[("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "0")]
    assert kib == pytest.approx(2 * 100e9 * 10 / 1024, rel=0.01)


def test_totals_alone_still_judge_when_no_link_is_named() -> None:
    """The agent's ring-buffer windows keep the per-GPU totals only."""
    from gpufleet.devices.types import Sample
    from gpufleet.health import GpuHealthInput, GpuWindow, HealthTracker, NodeHealthInput

    samples = [
        Sample(timestamp_s=t, nvlink_crc_flit_errors=10 * t, nvlink_recovery_errors=int(t >= 3))
        for t in range(6)
    ]
    gpu = GpuHealthInput(index=0, uuid="GPU-x", window=GpuWindow.of(samples))
    report = HealthTracker(None, clock=lambda: 6.0).evaluate(NodeHealthInput("n", (gpu,)))
    crc = find(report, "NVLINK_CRC_ERRORS")
    assert crc.severity == Severity.WARN and crc.evidence["per_s"] == 10.0
    assert crc.evidence["link"] is None and "NVLink:" in crc.message
    assert find(report, "NVLINK_RECOVERY_ERRORS").severity == Severity.FAIL
