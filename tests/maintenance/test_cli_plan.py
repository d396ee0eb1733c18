"""`gpufleet maintenance plan` as a user runs it: a simulated fleet with racks and mixed
drivers, a baseline, windows; JSON, HTML, table and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process


FLEET = """\
nodes:
  - {name: a, model: h100-sxm, gpus: 8, count: 4, rack: r01, driver_version: "535.104.05"}
  - {name: b, model: h100-sxm, gpus: 8, count: 4, rack: r02, driver_version: "535.104.05"}
  - {name: c, model: h100-sxm, gpus: 8, count: 2, rack: r03, driver_version: "550.90.07"}
"""
BASELINE = 'models:\n  h100-sxm:\n    driver: "550.90.07"\n'


def maintenance_plan(
    baseline: str, sim: str, *args: str, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    """``gpufleet maintenance plan --baseline BASELINE --sim SIM ARGS`` in a terminal of
    ``columns`` columns: its exit code and output."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "gpufleet", "maintenance", "plan"),
            *("--baseline", baseline, "--sim", sim, *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
    )


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "baseline.yaml").write_text(BASELINE)
    return maintenance_plan(str(tmp_path / "baseline.yaml"), str(tmp_path / "fleet.yaml"), *args)


def plan_json(tmp_path: Path, *args: str) -> Any:
    r = run(tmp_path, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_plan_updates_the_eight_old_nodes_two_racks_at_a_time(tmp_path: Path) -> None:
    doc = plan_json(
        tmp_path,
        "--batch",
        "2",
        "--floor",
        "75%",
        "--window",
        "Sat 02:00-06:00 UTC",
        "--start",
        "2026-12-01T00:00Z",
        "--drain-minutes",
        "10",
        "--update-minutes",
        "30",
        "--reboot-minutes",
        "16",
        "--validate-level",
        "1",
    )
    assert len(doc["out_of_baseline"]) == 8
    assert doc["out_of_baseline"][0]["changes"] == ["driver 535.104.05 -> 550.90.07 (GPU 0-7)"]
    order = doc["order"]
    assert {o["node"] for o in order} == {f"{p}-{i:02d}" for p in "ab" for i in range(4)}
    # 10+30+16+1 (verify)+1 (level 1) = 58 min per node; 4 h window fits 4 rounds of 2 nodes
    assert doc["per_node_s"] == 58 * 60
    starts = sorted({o["start"] for o in order})
    assert starts[0] == "2026-12-05T02:00:00+00:00" and len(starts) == 4
    for s in starts:  # each round: one node of each rack
        assert sorted(o["domain"] for o in order if o["start"] == s) == ["r01", "r02"]
    assert doc["windows_used"] == 1
    assert doc["min_in_service"] == 0.8  # 2 of 10 nodes out
    assert doc["serial_s"] > doc["duration_s"]


def test_select_and_html(tmp_path: Path) -> None:
    html = tmp_path / "plan.html"
    doc = plan_json(tmp_path, "--select", "rack=r02", "--html", str(html))
    assert {o["node"] for o in doc["order"]} == {"b-00", "b-01", "b-02", "b-03"}
    page = html.read_text()
    assert "floor 90 %" in page and "b-03" in page and "<svg" in page and "a-00" not in page


def test_table_output_names_changes_and_figures(tmp_path: Path) -> None:
    r = run(tmp_path, "--batch", "10%")
    assert r.returncode == 0, r.stderr
    assert "8 of 10 node(s) out of baseline" in r.stdout
    assert "driver 535.104.05 -> 550.90.07" in r.stdout
    assert "one node at a time" in r.stdout


def test_bad_input_is_one_line_naming_the_option(tmp_path: Path) -> None:
    for args, needle in (
        (["--select", "rak=r01"], "--select 'rak=r01'"),
        (["--batch", "0"], "--batch '0'"),
        (["--floor", "190%"], "--floor '190%'"),
        (["--window", "Sat 2-6"], "--window 'Sat 2-6'"),
        (["--start", "tomorrow"], "--start 'tomorrow'"),
    ):
        r = run(tmp_path, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr


def test_a_wrong_file_is_quoted_short_and_as_written(tmp_path: Path) -> None:
    """A passwd-like file given as the baseline: the error quotes the start of it, as written
    (no ":x:" turned into an emoji by the terminal library), not the whole file."""
    wrong = tmp_path / "passwd"
    wrong.write_text("".join(f"user{i}:x:{i}:{i}::/home/u{i}:/bin/sh\n" for i in range(200)))
    r = maintenance_plan(str(wrong), "1x8xh100-sxm", columns=300)
    assert r.returncode == 2
    assert "expected a mapping, got 'user0:x:0:0" in r.stderr
    assert len(r.stderr) < 300 and "user199" not in r.stderr
