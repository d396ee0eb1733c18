"""Health config from YAML: defaults, switches, thresholds, and errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.health import all_rules, health_config_from_mapping, load_health_config
from gpufleet.health.rules_gpu import PcieReplayParams
from gpufleet.health.rules_memory import SbeRateParams, XidParams


def test_registry_lists_every_rule_of_the_issue_with_a_description() -> None:
    expected = {
        "xid", "ecc_dbe", "sbe_rate", "row_remap_pending", "row_remap_failure",
        "remapped_rows", "retired_pages", "pcie_link", "pcie_replay_rate", "hw_slowdown",
        "temp_near_slowdown", "clock_held_low", "gpu_lost", "persistence_mode",
        "ecc_disabled", "driver_version_mismatch",
    }  # fmt: skip
    rules = all_rules()
    assert expected <= set(rules)
    assert all(r.description and r.default_enabled for r in rules.values())


def test_yaml_file_sets_thresholds_and_switches(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "agent: {listen: 0.0.0.0:9400}\n"
        "health:\n"
        "  xid_quiet_s: 120\n"
        "  rules:\n"
        "    persistence_mode: {enabled: false}\n"
        "    sbe_rate: {max_per_hour: 25}\n"
        "    pcie_replay_rate: {per_lane_per_min: {5: 3.0}}\n"
    )
    cfg = load_health_config(path)
    assert not cfg.enabled("persistence_mode") and cfg.enabled("sbe_rate")
    sbe = cfg.params("sbe_rate")
    assert isinstance(sbe, SbeRateParams) and sbe.max_per_hour == 25
    xid = cfg.params("xid")
    assert isinstance(xid, XidParams) and xid.quiet_s == 120
    replay = cfg.params("pcie_replay_rate")
    assert isinstance(replay, PcieReplayParams)
    assert replay.threshold_per_min(5, 16) == 48.0  # 3.0 per lane x 16 lanes
    assert replay.threshold_per_min(4, 8) == 24.0  # nearest listed generation


def test_defaults_match_the_issue_figures() -> None:
    cfg = health_config_from_mapping(None)
    replay = cfg.params("pcie_replay_rate")
    assert isinstance(replay, PcieReplayParams)
    assert replay.threshold_per_min(5, 16) == pytest.approx(1.92 * 16)
    assert replay.threshold_per_min(4, 16) == pytest.approx(0.96 * 16)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            {"health": {"rules": {"sbe_rate": {"max_per_hour": -1}}}},
            "health.rules.sbe_rate.max_per_hour",
        ),
        (
            {"health": {"rules": {"sbe_rate": {"max_per_hr": 3}}}},
            "health.rules.sbe_rate.max_per_hr",
        ),
        ({"health": {"rules": {"persistance_mode": {"enabled": False}}}}, "persistence_mode"),
        ({"health": {"rules": ["xid"]}}, "health.rules"),
        ({"health": {"rulez": {}}}, "health.rulez"),
        ({"health": {"rules": {"temp_near_slowdown": {"margin_c": "hot"}}}}, "margin_c"),
        ({"health": 3}, "health: expected a mapping"),
    ],
)
def test_bad_config_names_the_field(doc: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        health_config_from_mapping(doc, source="cfg.yaml")
    assert needle in str(err.value) and "cfg.yaml" in str(err.value)


def test_bad_yaml_and_missing_file_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("health: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: line 2: not valid YAML"):
        load_health_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_health_config(tmp_path / "nope.yaml")
