"""Every health rule firing and clearing on the simulator (production NVML backend) with
injected faults. Expected values come from the fault parameters and the thresholds of
issue 3, not from the rules' own output."""

from __future__ import annotations

from gpufleet.catalog import XidAction
from gpufleet.devices.sim import FaultKind
from gpufleet.health import HealthConfig, health_config_from_mapping
from gpufleet.health.types import Severity

from .rig import Rig, codes, find


def test_clean_node_is_ok_and_every_gpu_has_a_verdict() -> None:
    rig = Rig()
    report = rig.run(5)
    assert report.verdict == Severity.OK
    assert report.findings == ()
    assert report.gpu_verdicts == {u: Severity.OK for u in rig.uuids.values()}


def test_xid_warn_clears_after_the_quiet_period() -> None:
    cfg = health_config_from_mapping({"health": {"xid_quiet_s": 60}})
    rig = Rig(config=cfg)
    rig.inject(FaultKind.XID, gpu=1, xid=13, at_s=2)
    report = rig.run(5)
    f = find(report, "XID_13")
    # catalog: XID 13 is warn / restart_app; restart_app is weaker than reset_gpu: not sticky
    assert (f.severity, f.action, f.sticky, f.gpu_index) == (
        Severity.WARN,
        XidAction.RESTART_APP,
        False,
        1,
    )
    assert f.component == rig.uuids[1]
    assert report.verdict == Severity.WARN
    assert "XID_13" in codes(rig.run(50))  # 55 s after the event: still inside 60 s
    later = rig.run(10)  # 65 s after: quiet long enough
    assert "XID_13" not in codes(later)
    assert [c.code for c in later.cleared] == ["XID_13"]
    assert later.verdict == Severity.OK


def test_xid_unknown_code_warns_with_no_action() -> None:
    rig = Rig()
    rig.inject(FaultKind.XID, gpu=0, xid=999)
    f = find(rig.run(2), "XID_999")
    assert (f.severity, f.action, f.sticky) == (Severity.WARN, XidAction.NONE, False)


def test_xid_reset_or_stronger_is_sticky_past_the_quiet_period() -> None:
    cfg = health_config_from_mapping({"health": {"xid_quiet_s": 30}})
    rig = Rig(config=cfg)
    rig.inject(FaultKind.XID, gpu=2, xid=79)
    f = find(rig.run(2), "XID_79")
    assert (f.severity, f.action, f.sticky) == (Severity.FAIL, XidAction.REBOOT_NODE, True)
    report = rig.run(120)
    assert "XID_79" in codes(report) and report.verdict == Severity.FAIL
    rig.tracker.acknowledge("XID_79", rig.uuids[2], "ops", "replaced riser")
    after = rig.run(1)
    assert "XID_79" not in codes(after) and after.verdict == Severity.OK
    assert [c.code for c in after.cleared] == ["XID_79"]


def test_ecc_dbe_is_sticky_fail_with_reset_action() -> None:
    rig = Rig()
    rig.inject(FaultKind.ECC_DBE, gpu=3, count=2)
    report = rig.run(2)
    f = find(report, "ECC_DBE_VOLATILE")
    assert (f.severity, f.action, f.sticky) == (Severity.FAIL, XidAction.RESET_GPU, True)
    assert f.evidence["ecc_dbe_volatile"] == 2
    assert "XID_48" in codes(report, 3)  # the simulator reports a DBE as XID 48 too
    rig.node.gpus[3].ecc_dbe_volatile = 0  # a GPU reset clears the volatile counter
    assert "ECC_DBE_VOLATILE" in codes(rig.run(70))  # sticky: the condition left, it stays
    rig.tracker.acknowledge("ECC_DBE_VOLATILE", rig.uuids[3], "ops", "GPU reset, DBE gone")
    assert "ECC_DBE_VOLATILE" not in codes(rig.run(1))


def test_sbe_rate_fires_above_threshold_and_clears_when_it_stops() -> None:
    rig = Rig(window_s=60)
    # 120 corrected errors per minute = 7200/h, far above the default 10/h
    rig.inject(FaultKind.ECC_SBE, gpu=0, rate_per_min=120, duration_s=20)
    report = rig.run(20)
    f = find(report, "ECC_SBE_RATE")
    assert f.severity == Severity.WARN and not f.sticky
    assert f.evidence["per_hour"] > 10 * 100
    assert "ECC_SBE_RATE" not in codes(rig.run(65))  # counter flat over the whole window


def test_sbe_a_one_off_burst_is_not_a_rate_and_threshold_is_configurable() -> None:
    cfg = health_config_from_mapping({"health": {"rules": {"sbe_rate": {"max_per_hour": 1e6}}}})
    rig = Rig(config=cfg)
    rig.inject(FaultKind.ECC_SBE, gpu=0, rate_per_min=120)
    assert "ECC_SBE_RATE" not in codes(rig.run(20))  # ~7200/h < 1e6/h


def test_row_remap_pending_warns_reset_and_clears_after() -> None:
    rig = Rig()
    rig.inject(FaultKind.ROW_REMAP_PENDING, gpu=1, duration_s=5)
    f = find(rig.run(2), "ROW_REMAP_PENDING")
    assert (f.severity, f.action, f.sticky) == (Severity.WARN, XidAction.RESET_GPU, False)
    later = rig.run(5)
    assert "ROW_REMAP_PENDING" not in codes(later)
    assert "ROW_REMAP_PENDING" in [c.code for c in later.cleared]


def test_row_remap_failure_is_sticky_drain_and_inspect() -> None:
    rig = Rig()
    rig.inject(FaultKind.ROW_REMAP_FAILURE, gpu=0, duration_s=5)
    f = find(rig.run(2), "ROW_REMAP_FAILURE")
    assert (f.severity, f.action, f.sticky) == (Severity.FAIL, XidAction.DRAIN_AND_INSPECT, True)
    assert "ROW_REMAP_FAILURE" in codes(rig.run(10))  # condition gone, still reported
    rig.tracker.acknowledge("ROW_REMAP_FAILURE", rig.uuids[0], "ops", "RMA ticket 42")
    assert "ROW_REMAP_FAILURE" not in codes(rig.run(1))


def test_remapped_rows_warn_at_512_not_511() -> None:
    rig = Rig()
    rig.inject(FaultKind.ECC_DBE, gpu=0, count=512)  # each DBE remaps a row (simulator)
    rig.inject(FaultKind.ECC_DBE, gpu=1, count=511)
    report = rig.run(2)
    assert "REMAPPED_ROWS_HIGH" in codes(report, 0)
    assert "REMAPPED_ROWS_HIGH" not in codes(report, 1)
    assert find(report, "REMAPPED_ROWS_HIGH").severity == Severity.WARN
    rig.node.gpus[0].remapped_unc = 0  # a repaired/replaced board
    assert "REMAPPED_ROWS_HIGH" not in codes(rig.run(2))


def test_retired_pages_limit_63_is_sticky_fail() -> None:
    rig = Rig()
    rig.inject(FaultKind.RETIRED_PAGES, gpu=0, sbe=40, dbe=23, duration_s=5)  # 63
    rig.inject(FaultKind.RETIRED_PAGES, gpu=1, sbe=40, dbe=22, duration_s=5)  # 62
    report = rig.run(2)
    f = find(report, "RETIRED_PAGES_LIMIT")
    assert f.gpu_index == 0 and f.severity == Severity.FAIL and f.sticky
    assert f.action == XidAction.DRAIN_AND_INSPECT
    assert "RETIRED_PAGES_LIMIT" in codes(rig.run(10))
    rig.tracker.acknowledge("RETIRED_PAGES_LIMIT", rig.uuids[0], "ops", "board swapped")
    assert "RETIRED_PAGES_LIMIT" not in codes(rig.run(1))


def test_pcie_width_downgrade_warns_even_idle_and_clears() -> None:
    rig = Rig()
    rig.inject(FaultKind.PCIE_DOWNGRADE, gpu=2, width=8, duration_s=5)
    f = find(rig.run(2), "PCIE_WIDTH_DOWNGRADED")
    assert f.severity == Severity.WARN and f.evidence["width"] == 8
    assert f.evidence["width_max"] == 16
    assert "PCIE_WIDTH_DOWNGRADED" not in codes(rig.run(5))


def test_pcie_gen_downgrade_only_counts_while_busy() -> None:
    rig = Rig()
    rig.inject(FaultKind.PCIE_DOWNGRADE, gpu=1, gen=4)
    assert "PCIE_GEN_DOWNGRADED" not in codes(rig.run(3))  # idle: links train down
    rig.load(1)
    f = find(rig.run(3), "PCIE_GEN_DOWNGRADED")
    assert (f.evidence["gen"], f.evidence["gen_max"]) == (4, 5)
    rig.node.gpus[1].stop()
    assert "PCIE_GEN_DOWNGRADED" not in codes(rig.run(3))


def test_pcie_replay_threshold_is_per_lane_times_width_by_generation() -> None:
    rig = Rig(window_s=60)
    # Gen5 x16: 1.92 * 16 = 30.72/min. 20/min is under it; 120/min is over.
    rig.inject(FaultKind.PCIE_REPLAYS, gpu=0, rate_per_min=20)
    rig.inject(FaultKind.PCIE_REPLAYS, gpu=1, rate_per_min=120, duration_s=30)
    # Gen4 x16: 0.96 * 16 = 15.36/min, so 20/min is over it.
    rig.inject(FaultKind.PCIE_DOWNGRADE, gpu=2, gen=4)
    rig.inject(FaultKind.PCIE_REPLAYS, gpu=2, rate_per_min=20)
    report = rig.run(30)
    assert "PCIE_REPLAY_RATE" not in codes(report, 0)
    assert "PCIE_REPLAY_RATE" in codes(report, 1)
    assert "PCIE_REPLAY_RATE" in codes(report, 2)
    by_gpu = {f.gpu_index: f for f in report.findings if f.code == "PCIE_REPLAY_RATE"}
    assert abs(by_gpu[1].evidence["threshold_per_min"] - 30.72) < 1e-9
    assert abs(by_gpu[2].evidence["threshold_per_min"] - 15.36) < 1e-9
    assert 100 <= by_gpu[1].evidence["per_min"] <= 125
    later = rig.run(65)  # GPU 1's replays stopped 30 s ago... and the window rolled past them
    assert "PCIE_REPLAY_RATE" not in codes(later, 1)
    assert "PCIE_REPLAY_RATE" in codes(later, 2)


def test_hw_thermal_slowdown_and_power_brake_fire_and_clear() -> None:
    rig = Rig()
    rig.load(0)
    rig.load(1)
    rig.inject(FaultKind.THERMAL_SLOWDOWN, gpu=0, duration_s=5)
    rig.inject(FaultKind.HW_POWER_BRAKE, gpu=1, duration_s=5)
    report = rig.run(3)
    assert "HW_THERMAL_SLOWDOWN" in codes(report, 0)
    assert "HW_POWER_BRAKE" in codes(report, 1)
    assert "HW_POWER_BRAKE" not in codes(report, 0)
    later = rig.run(5)
    assert not {"HW_THERMAL_SLOWDOWN", "HW_POWER_BRAKE"} & codes(later)


def test_temperature_within_5c_of_slowdown() -> None:
    rig = Rig()
    rig.load(0)
    rig.inject(FaultKind.THERMAL_SLOWDOWN, gpu=0, duration_s=5)  # 2 C above the 87 C limit
    f = find(rig.run(3), "TEMP_NEAR_SLOWDOWN")
    assert f.evidence["slowdown_temp_c"] == 87 and f.evidence["gpu_temp_c"] >= 82
    assert "TEMP_NEAR_SLOWDOWN" not in codes(rig.run(30))  # back to ~60 C under load


def test_clock_held_low_needs_load_duration_and_no_power_cap() -> None:
    rig = Rig(window_s=60)
    for g in (0, 1):
        rig.load(g)
    rig.inject(FaultKind.THERMAL_SLOWDOWN, gpu=0, duration_s=50)  # clock cut to half
    short = rig.run(20)
    assert "CLOCK_HELD_LOW" not in codes(short)  # 20 s < 30 s
    report = rig.run(20)
    f = find(report, "CLOCK_HELD_LOW")
    assert f.gpu_index == 0 and f.evidence["held_s"] >= 30
    assert f.evidence["sm_clock_mhz"] <= 0.5 * 1980 + 15
    # GPU 1 runs the same load at its power cap (reason 0x4): below max but not flagged
    assert "CLOCK_HELD_LOW" not in codes(report, 1)
    assert "CLOCK_HELD_LOW" not in codes(rig.run(15))  # the fault ended at 50 s


def test_gpu_lost_is_sticky_fail_reboot() -> None:
    rig = Rig()
    rig.inject(FaultKind.FALLEN_OFF_BUS, gpu=2, at_s=3)
    report = rig.run(5)
    f = find(report, "GPU_LOST")
    assert (f.severity, f.action, f.sticky) == (Severity.FAIL, XidAction.REBOOT_NODE, True)
    assert f.component == rig.uuids[2]
    assert report.gpu_verdicts[rig.uuids[2]] == Severity.FAIL
    assert report.gpu_verdicts[rig.uuids[0]] == Severity.OK  # the others keep sampling
    assert "GPU_LOST" in codes(rig.run(5))


def test_persistence_mode_off_and_ecc_disabled_warn_and_clear() -> None:
    rig = Rig()
    rig.inject(FaultKind.PERSISTENCE_OFF, gpu=0, duration_s=4)
    rig.inject(FaultKind.ECC_DISABLED, gpu=1, duration_s=4)
    report = rig.run(2)
    assert codes(report, 0) == {"PERSISTENCE_MODE_OFF"}
    assert codes(report, 1) == {"ECC_DISABLED"}
    assert report.verdict == Severity.WARN
    later = rig.run(4)
    assert later.findings == () and later.verdict == Severity.OK
    assert {c.code for c in later.cleared} == {"PERSISTENCE_MODE_OFF", "ECC_DISABLED"}


def test_driver_nvml_version_mismatch_fails_node() -> None:
    rig = Rig()
    nvml = rig.node.nvml
    # user-space library 570.86.15 while the kernel driver is 580.159.04 (a package upgrade
    # without a reboot); NVML's version string is "<CUDA major>.<driver version>"
    nvml.nvmlSystemGetNVMLVersion = lambda: "13.570.86.15"  # type: ignore[method-assign]
    report = rig.run(1)
    f = find(report, "DRIVER_VERSION_MISMATCH")
    assert (f.component, f.severity, f.action) == ("node", Severity.FAIL, XidAction.REBOOT_NODE)
    assert "570.86.15" in f.message and "580.159.04" in f.message
    assert report.verdict == Severity.FAIL
    del nvml.nvmlSystemGetNVMLVersion  # rebooted: versions agree again
    assert "DRIVER_VERSION_MISMATCH" not in codes(rig.run(1))


def test_a_rule_switched_off_produces_nothing() -> None:
    cfg = health_config_from_mapping(
        {"health": {"rules": {"persistence_mode": {"enabled": False}, "ecc_dbe": False}}}
    )
    assert not cfg.enabled("persistence_mode") and not cfg.enabled("ecc_dbe")
    rig = Rig(config=cfg)
    rig.inject(FaultKind.PERSISTENCE_OFF, gpu=0)
    rig.inject(FaultKind.ECC_DBE, gpu=1)
    report = rig.run(2)
    assert "PERSISTENCE_MODE_OFF" not in codes(report)
    assert "ECC_DBE_VOLATILE" not in codes(report)
    assert "XID_48" in codes(report)  # the other rules still run
    default = Rig(config=HealthConfig())
    default.inject(FaultKind.PERSISTENCE_OFF, gpu=0)
    assert "PERSISTENCE_MODE_OFF" in codes(default.run(2))
