"""The HTML reports (`gpufleet validate --html`, `gpufleet plan --html`) in a real Chromium:
axes carry units and human-readable values, the charts an operator needs are there (busbw
against message size, stress traces with y axes, break-even month) and none is empty, no
label leaves its chart or sits on another, nothing overflows its box. One full-page screenshot
per report is kept under test-artifacts/ (or $GPUFLEET_ARTIFACTS); its path is printed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.web.conftest import REPO, artifacts_dir

runner = CliRunner()
EXAMPLES = REPO / "src" / "gpufleet" / "plan" / "examples"

# Every chart text's box (client rect, so rotations and transforms count) against its SVG's box,
# and every pair of texts of one SVG against each other; every HTML box that scrolls sideways
# although it is not meant to (.scroll wraps wide tables on purpose).
LAYOUT_JS = """() => {
  const out = {outside: [], overlaps: [], overflowing: [], charts: []};
  const inter = (a, b) => Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left))
                        * Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    const label = svg.getAttribute('aria-label');
    const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
    out.charts.push({label, texts: texts.length, lines: svg.querySelectorAll('polyline').length,
                     bars: svg.querySelectorAll('rect').length});
    const rects = texts.map(t => [t.textContent.trim(), t.getBoundingClientRect()]);
    for (const [s, r] of rects) {
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 ||
          r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) out.outside.push(label + ': ' + s);
    }
    for (let i = 0; i < rects.length; i++) for (let j = i + 1; j < rects.length; j++) {
      if (inter(rects[i][1], rects[j][1]) > 2)
        out.overlaps.push(label + ': ' + rects[i][0] + ' / ' + rects[j][0]);
    }
  }
  for (const el of document.querySelectorAll('h1,h2,h3,p,li,td,th,.kpi,table')) {
    if (el.closest('.scroll') && el.tagName !== 'TD' && el.tagName !== 'TH') continue;
    if (el.scrollWidth > el.clientWidth + 1) out.overflowing.push(el.tagName + ': ' +
        el.textContent.slice(0, 40));
  }
  out.pageWider = document.documentElement.scrollWidth > window.innerWidth;
  return out;
}"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("reports")
    out = {"validate": d / "validate.html"}
    args = ["validate", "--sim", "2x8xh100", "--level", "3", "--duration", "60"]
    r = runner.invoke(app, [*args, "--html", str(out["validate"])])
    assert r.exit_code == 0, r.output
    for example in ("training-1024", "inference-fleet"):
        out[example] = d / f"{example}.html"
        r = runner.invoke(
            app, ["plan", str(EXAMPLES / f"{example}.yaml"), "--html", str(out[example])]
        )
        assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _open(page: Any, path: Path, name: str) -> tuple[dict[str, Any], str]:
    page.goto(path.as_uri())
    layout = page.evaluate(LAYOUT_JS)
    shot = artifacts_dir() / f"report-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    text = page.inner_text("body")
    svg_text = page.evaluate(
        "() => [...document.querySelectorAll('svg text')].map(t => t.textContent).join(' | ')"
    )
    return layout, text + "\n" + svg_text


def _clean_layout(layout: dict[str, Any]) -> None:
    assert layout["outside"] == []
    assert layout["overlaps"] == []
    assert layout["overflowing"] == []
    assert layout["pageWider"] is False
    empty = [c["label"] for c in layout["charts"] if not (c["lines"] or c["bars"])]
    assert empty == []  # every chart draws something


def test_validate_report_axes_curves_and_traces(page: Any, reports: dict[str, Path]) -> None:
    layout, text = _open(page, reports["validate"], "validate")
    _clean_layout(layout)
    charts = {c["label"]: c for c in layout["charts"]}
    # busbw against message size: one chart per scope, one line per collective
    curves = [c for label, c in charts.items() if label.startswith("Bus bandwidth vs message")]
    assert len(curves) == 3 and all(c["lines"] >= 5 for c in curves)  # sim-00, sim-01, fleet
    assert "busbw (GB/s)" in text and "message size" in text
    assert re.search(r"\b\d+ (KiB|MiB|GiB)\b", text)  # sizes in binary units, not bytes
    assert not re.search(r"\b\d{7,}\b", text)  # no raw byte counts such as 8589934592
    # stress traces: each quantity with its own y axis in its unit, one line per GPU
    for label, axis in (
        ("Stress: Power per GPU", "Power (W)"),
        ("Stress: SM clock per GPU", "SM clock (MHz)"),
        ("Stress: GPU temperature per GPU", "GPU temperature (°C)"),
    ):
        assert charts[label]["lines"] == 16
        assert axis in text
    assert "time (s)" in text
    # per-GPU bars with their unit on the value axis and the pass line
    assert charts["matmul bf16"]["bars"] >= 16 and "TFLOP/s" in text and "pass line" in text


def test_plan_reports_money_break_even_and_no_empty_chart(
    page: Any, reports: dict[str, Path]
) -> None:
    layout, text = _open(page, reports["training-1024"], "plan-training")
    _clean_layout(layout)
    labels = {c["label"] for c in layout["charts"]}
    assert {"Cumulative cost: own vs cloud", "TCO", "Training days"} <= labels
    assert not re.search(r"\d[eE][+-]\d", text)  # no 8.48e+07
    assert re.search(r"\$\d+(\.\d)?M", text)  # money as $84.8M
    m = re.search(r"break-even: month (\d+)", text)
    assert m is not None
    assert f"month {m.group(1)}" in page.inner_text(".kpi:has-text('Owning beats cloud')")
    assert "cumulative cost (USD)" in text and "months" in text
    layout, text = _open(page, reports["inference-fleet"], "plan-inference")
    _clean_layout(layout)
    labels = {c["label"] for c in layout["charts"]}
    assert "Training days" not in labels  # an inference plan has no training days chart
    assert "TCO" in labels
    # break-even (month 49) lies beyond the 3-year horizon: the chart reaches it and marks it
    kpi = page.inner_text(".kpi:has-text('Owning beats cloud')")
    month = re.search(r"month (\d+)", kpi)
    assert month is not None and f"break-even: month {month.group(1)}" in text


def test_the_layout_check_sees_overlaps_and_clipping(page: Any, tmp_path: Path) -> None:
    """The checker itself: two labels on top of each other and one past the SVG's edge."""
    f = tmp_path / "bad.html"
    f.write_text(
        '<!DOCTYPE html><html><body><svg width="200" height="60" aria-label="bad">'
        '<text x="10" y="20">8589934592</text><text x="14" y="22">overlap</text>'
        '<text x="170" y="50">clipped label</text></svg></body></html>'
    )
    page.goto(f.as_uri())
    layout = page.evaluate(LAYOUT_JS)
    assert layout["overlaps"] == ["bad: 8589934592 / overlap"]
    assert layout["outside"] == ["bad: clipped label"]
