"""`gpufleet power sweep --html` shows the locked-clock sweep beside the power-limit sweep
(issue 31): one row per swept clock with the sweep's own figures, its recommendation, the knob
that saves more at the same slowdown budget, and "modelled" on every section the simulator's
DVFS model produced; `--clocks` alone writes the page too."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app

cli = CliRunner()
ARGS = ["power", "sweep", "--sim", "1x1xh200", "--workload", "hbm", "--seconds", "4"]
CLOCKS = ["--clocks", "1980,1860,...,1020"]


def _rows(page: str, table: str) -> list[list[str]]:
    """The cells of each data row of ``<table id=TABLE>``."""
    m = re.search(rf"<table id='{table}'>(.*?)</table>", page, re.S)
    assert m is not None, f"no table {table}"
    rows = re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)[1:]  # the first is the heading
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r)] for r in rows]


def _expected(points: list[dict[str, Any]], key: str) -> list[list[str]]:
    """The rows the sweep's JSON points call for, formatted as the CLI's table formats them."""
    return [
        [
            f"{p[key]:g}",
            f"{p['throughput']:.1f}",
            "N/A" if p["power_w"] is None else f"{p['power_w']:.0f}",
            "N/A" if p["throughput_per_w"] is None else f"{p['throughput_per_w']:.3f}",
            p["energy_method"] or "N/A",
        ]
        for p in points
    ]


def _sweep(tmp: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[dict[str, Any], str]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp))
    out = tmp / "sweep.html"
    res = cli.invoke(app, [*ARGS, *extra, "--json", "--html", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out.read_text()


def test_html_report_has_the_clock_sweep_and_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, page = _sweep(tmp_path, monkeypatch, "--limits", "700,600,500,400", *CLOCKS)
    clock_pts = doc["clock_sweep"]["points"]
    assert [p["clock_mhz"] for p in clock_pts] == list(range(1980, 1019, -120))
    assert _rows(page, "clock-sweep") == _expected(clock_pts, "clock_mhz")
    for p, row in zip(clock_pts, _rows(page, "clock-sweep"), strict=True):  # not rounded away
        assert float(row[1]) == pytest.approx(p["throughput"], abs=0.05)
    assert _rows(page, "limit-sweep") == _expected(doc["points"], "limit_w")
    assert page.count("<svg") == 4 and "throughput vs SM clock (MHz)" in page
    # the recommendation and the winner are the sweep's
    rec = doc["clock_sweep"]["recommendation"]
    shown = re.search(r"Recommended locked clock: (\d+) MHz \(slowdown ([\d.]+)%", page)
    assert shown is not None and int(shown.group(1)) == rec["clock_mhz"]
    assert float(shown.group(2)) == pytest.approx(100 * rec["slowdown"], abs=0.051)
    assert doc["knobs"]["winner"] == "locked_clock"
    knobs = re.search(r"<ul id='knobs'>(.*?)</ul>", page, re.S)
    assert knobs is not None and "<li>winner: locked clock by " in knobs.group(1)
    margin = doc["knobs"]["margin"] * 100
    assert f"by {margin:.1f} points" in knobs.group(1)
    # modelled: the page, each section and the model's source
    headings = re.findall(r"<h[12]>(.*?)</h[12]>", page)
    assert headings == [
        "Power sweep (modelled): hbm",
        "Power limit (modelled)",
        "Locked SM clock (modelled)",
        "Which knob saves more (modelled)",
    ]
    assert "Mei, Wang and Chu" in html.unescape(page)


def test_clocks_alone_write_the_page_without_a_limit_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, page = _sweep(tmp_path, monkeypatch, *CLOCKS)
    assert "points" not in doc and doc["modelled"] is True
    assert _rows(page, "clock-sweep") == _expected(doc["clock_sweep"]["points"], "clock_mhz")
    assert "limit-sweep" not in page and page.count("<svg") == 2
    assert "<li>winner: locked clock" in page
