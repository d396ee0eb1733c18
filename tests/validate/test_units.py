"""Thresholds, robust z-scores, bus factors, suite selection, host lists, result schema, HTML."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.cli.app import app
from gpufleet.errors import ConfigError, UnknownNameError
from gpufleet.validate.analysis import Observation, find_stragglers, robust_z
from gpufleet.validate.collectives import message_sizes, row
from gpufleet.validate.report_html import render_html
from gpufleet.validate.results import SCHEMA, Status, ValidationReport
from gpufleet.validate.suite import select_tests
from gpufleet.validate.thresholds import Thresholds, expected_matmul_tflops, parse_thresholds
from tests.validate.conftest import FAULTS, run_sim


def test_expected_h200_figures_are_catalog_measurements() -> None:
    h200 = load_catalog().gpu("h200-sxm")
    assert expected_matmul_tflops(h200, "bf16") == pytest.approx(792.4)  # load_trace.json
    # h100: no own measurement -> peak 989.5 x (792.4 / 989.5) of the H200
    assert expected_matmul_tflops(load_catalog().gpu("h100-sxm"), "bf16") == pytest.approx(792.4)
    assert expected_matmul_tflops(load_catalog().gpu("a100-sxm4-80gb"), "fp8") is None


def test_judge_pass_warn_fail_lines() -> None:
    thr = Thresholds()
    assert thr.judge("matmul", "bf16", 91.0, 100.0, "x").status is Status.WARN  # 0.90..0.95
    assert thr.judge("matmul", "bf16", 89.9, 100.0, "x").status is Status.FAIL
    assert thr.judge("matmul", "bf16", 96.0, 100.0, "x").status is Status.PASS
    custom = parse_thresholds("tests:\n  matmul: {pass_fraction: 0.8, warn_fraction: 0.8}\n")
    assert custom.judge("matmul", "bf16", 81.0, 100.0, "x").status is Status.PASS
    assert custom.judge("hbm_bandwidth", "copy", 81.0, 100.0, "x").status is Status.FAIL


def test_thresholds_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"tests\.matmull"):
        parse_thresholds("tests:\n  matmull: {pass_fraction: 0.8}\n", "t.yaml")
    with pytest.raises(ConfigError, match=r"t.yaml:1: defaults.pass_fractio.*'pass_fraction'"):
        parse_thresholds("defaults: {pass_fractio: 0.8}\n", "t.yaml")
    with pytest.raises(ConfigError, match="warn_fraction"):
        parse_thresholds("defaults: {pass_fraction: 0.9, warn_fraction: 0.5}\n")


def test_robust_z_by_hand() -> None:
    # values 1..5 and 20: median 3.5, |dev| = 2.5 1.5 .5 .5 1.5 16.5 -> MAD 1.5
    med, mad, zs = robust_z([1, 2, 3, 4, 5, 20])
    assert med == 3.5 and mad == 1.5
    assert zs[-1] == pytest.approx(0.6745 * 16.5 / 1.5)


def test_stragglers_only_on_the_bad_side_and_far_enough() -> None:
    vals = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 90.0, 110.0]
    obs = [Observation("matmul", "bf16", f"g{i}", "h200-sxm", v) for i, v in enumerate(vals)]
    s = find_stragglers(obs)
    assert [x.component for x in s] == ["g7"]  # g8 is faster: not a straggler
    assert s[0].deviation_pct == pytest.approx(-10.0)


def test_bus_factors_from_nccl_tests() -> None:
    n = 8
    assert row("all_reduce", 8_000, 1e-6, n).busbw_gbps == pytest.approx(8.0 * 2 * 7 / 8)
    assert row("all_gather", 8_000, 1e-6, n).busbw_gbps == pytest.approx(8.0 * 7 / 8)
    assert row("broadcast", 8_000, 1e-6, n).busbw_gbps == pytest.approx(8.0)
    sizes = message_sizes()
    assert sizes[0] == 8 and sizes[-1] == 8 * 2**30 and len(sizes) == 31


def test_select_tests_levels_only_skip() -> None:
    assert "matmul" not in select_tests(1)
    assert "matmul" in select_tests(2) and "stress" not in select_tests(2)
    assert "pairwise" not in select_tests(3) and "pairwise" in select_tests(3, multi_node=True)
    assert select_tests(1, only=["matmul", "ecc"]) == ["ecc", "matmul"]
    assert "ecc" not in select_tests(1, skip=["ecc"])
    with pytest.raises(UnknownNameError):
        select_tests(1, only=["matmull"])


def test_json_roundtrip_and_html_self_contained(tmp_path: Path) -> None:
    r = run_sim(spec="4x8xh200", seed=2, level=3, faults=FAULTS[:3])
    d = json.loads(r.to_json())
    assert d["schema"] == SCHEMA and d["status"] == "fail" and d["exit_code"] == 2
    assert d["nodes"]["sim-01"] == "fail" and d["nodes"]["sim-00"] in ("pass", "warn")
    back = ValidationReport.from_dict(d)
    assert back.status is Status.FAIL and len(back.results) == len(r.results)
    with pytest.raises(ConfigError):
        ValidationReport.from_dict({"schema": "other"})
    html = render_html(r)
    assert "<svg" in html and "sim-01/gpu2" in html and "Node-to-node" in html
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert "<script" not in html


def test_cli_exit_codes_and_files(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", "--sim", "2x8xh200", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["status"] == "pass"
    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        "seed: 3\nnodes:\n  - {name: n, model: h200, gpus: 8, count: 2}\n"
        "faults:\n  - {node: n-01, gpu: 1, kind: row_remap_pending}\n"
    )
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    bad = runner.invoke(
        app, ["validate", "--sim", str(fleet), "--out", str(out), "--html", str(html)]
    )
    assert bad.exit_code == 2, bad.output
    assert json.loads(out.read_text())["nodes"]["n-01"] == "fail" and html.is_file()
    cfg = tmp_path / "t.yaml"
    cfg.write_text("defaults: {pass_fraction: 0.9, warn_fraction: 1.2}\n")  # everything warns
    warn = runner.invoke(
        app,
        [
            "validate",
            "--sim",
            "2x8xh200",
            "--level",
            "2",
            "--only",
            "hbm_bandwidth",
            "--config",
            str(cfg),
            "--json",
        ],
    )
    assert warn.exit_code == 1, warn.output
    unknown = runner.invoke(app, ["validate", "--sim", "2x8xh200", "--only", "nope"])
    assert isinstance(unknown.exception, UnknownNameError)  # main() prints it, exit 2
    assert unknown.exception.exit_code == 2


@pytest.mark.parametrize(
    ("gpus", "needle"),
    [("9", "no GPU 9 here"), ("0,8,12", "no GPU 8,12 here"), ("-1", "expected indexes")],
)
def test_cli_gpus_out_of_range_is_a_usage_error(gpus: str, needle: str) -> None:
    """`--gpus 9` on 8-GPU nodes used to pass after running node-level tests only."""
    from gpufleet.errors import UsageError

    result = CliRunner().invoke(app, ["validate", "--sim", "1x8xh200", f"--gpus={gpus}"])
    assert isinstance(result.exception, UsageError), result.output
    assert result.exception.exit_code == 2 and needle in str(result.exception)


def test_level1_runs_the_agents_health_rules() -> None:
    """Thermal slowdown is no level-1 check of its own: the agent's health rules catch it."""
    from gpufleet.devices.sim import Fault, FaultKind

    report = run_sim(
        "1x2xh100",
        level=1,
        faults=(Fault(FaultKind.THERMAL_SLOWDOWN, node="sim-00", gpu=1),),
    )
    rows = {(r.component, r.status) for r in report.results if r.test == "health_rules"}
    assert ("sim-00/gpu0", Status.PASS) in rows
    bad = [r for r in report.results if r.test == "health_rules" and r.component == "sim-00/gpu1"]
    assert len(bad) == 1 and bad[0].status in (Status.WARN, Status.FAIL)
    # 89 C against the 87 C slowdown limit (catalog h100-sxm) -> the temperature rule fires
    assert set(bad[0].details["codes"]) & {"TEMP_NEAR_SLOWDOWN", "HW_THERMAL_SLOWDOWN"}


def test_level1_flags_a_stray_process() -> None:
    """A GPU that already runs a compute process fails the `processes` check (pid from NVML)."""
    from gpufleet.devices.sim import Load, ManualClock, SimFleet, parse_fleet_spec
    from gpufleet.simvalidate import SimEngine
    from gpufleet.validate.runner import RunOptions, run_suite

    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x2xh100"), clock=clock)
    fleet.node("sim-00").gpus[0].run(Load(util=0.3))
    clock.advance(1)
    report = run_suite(
        SimEngine(fleet, clock), RunOptions(tests=select_tests(1, multi_node=False), level=1)
    )
    procs = {r.gpu: r for r in report.results if r.test == "processes"}
    assert procs[0].status == Status.FAIL and "10000" in procs[0].message
    assert procs[1].status == Status.PASS


def test_report_file_reader_names_the_bad_field_and_keeps_missing_figures_null() -> None:
    r = run_sim(spec="1x8xh200", seed=3, level=1)
    d = json.loads(r.to_json())
    # a figure nobody measured is written as null and reads back as NaN, never as 0
    d["results"][0]["metrics"].append(
        {
            "name": "x",
            "value": None,
            "unit": "GB/s",
            "expected": None,
            "pass_min": None,
            "status": "skip",
        }
    )
    back = ValidationReport.from_dict(d)
    assert math.isnan(back.results[0].metrics[-1].value)
    d["results"][1]["status"] = "great"
    with pytest.raises(ConfigError, match=r"run\.json: .*results\.1\.status"):
        ValidationReport.from_dict(d, source="run.json")
    with pytest.raises(ConfigError, match="schema"):
        ValidationReport.from_dict([], source="run.json")  # type: ignore[arg-type]
