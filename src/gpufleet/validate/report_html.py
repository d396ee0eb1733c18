"""A self-contained HTML report: inline SVG charts and CSS, no scripts, no external assets.

Per-GPU TFLOP/s and bandwidth bars (value axis in the unit, pass line), power/clock/temperature
traces of the stress run (one chart per quantity with its own y axis), busbw against message
size for each collective scope, the pairwise bandwidth matrix, the straggler list and the
environment (driver, CUDA, VBIOS per GPU). Charts come from :mod:`gpufleet.svgchart`; a
figure nobody measured draws no chart. It opens offline in any browser.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from gpufleet.svgchart import Series, bar_chart, fmt_bytes, line_chart
from gpufleet.validate.results import CollectiveRow, Status, TracePoint, ValidationReport

COLORS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "skip": "#757575"}
CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.pass{color:#2e7d32}.warn{color:#ef6c00}.fail{color:#c62828;font-weight:bold}.skip{color:#757575}
h1 .badge{padding:2px 10px;border-radius:4px;color:#fff}
svg{background:#fafafa;border:1px solid #ddd;margin:4px;max-width:100%;height:auto}
.scroll{overflow-x:auto;max-width:100%}
"""
MAX_BARS = 256


def _bars(title: str, items: list[tuple[str, float, str]], unit: str, line: float | None) -> str:
    """One bar per component, coloured by status, with a value axis in ``unit`` and the pass
    line; nothing when no component has the figure."""
    return bar_chart(
        title,
        [(label, v, COLORS.get(st, "#555")) for label, v, st in items[:MAX_BARS]],
        value_label=unit,
        line=None if line is None else (line, "pass line"),
    )


_TRACE_CHARTS: tuple[tuple[str, str, Callable[[TracePoint], float | None]], ...] = (
    ("Power", "W", lambda p: p.power_w),
    ("SM clock", "MHz", lambda p: None if p.sm_clock_mhz is None else float(p.sm_clock_mhz)),
    ("GPU temperature", "°C", lambda p: p.temp_c),
)
MAX_TRACES = 64
LEGEND_MAX = 12  # more lines than this: names in tooltips only


def _traces(traces: dict[str, list[TracePoint]]) -> str:
    """Power, SM clock and temperature over the stress run: one chart each, one line per GPU,
    each with its own y axis in its unit and time in seconds on x."""
    chosen = list(traces.items())[:MAX_TRACES]
    out = []
    for title, unit, get in _TRACE_CHARTS:
        series = [Series(name, [p.t_s for p in pts], [get(p) for p in pts]) for name, pts in chosen]
        out.append(
            line_chart(
                f"Stress: {title} per GPU",
                series,
                x_label="time (s)",
                y_label=f"{title} ({unit})",
                legend=len(series) <= LEGEND_MAX,
            )
        )
    return "".join(out)


def _busbw_curves(collectives: dict[str, list[CollectiveRow]]) -> str:
    """busbw against message size, one chart per scope and one line per collective, message
    sizes on a log2 axis as nccl-tests sweeps them."""
    out = []
    for scope, rows in collectives.items():
        ops = sorted({c.op for c in rows})
        series = []
        for op in ops:
            pts = sorted((c.size_bytes, c.busbw_gbps) for c in rows if c.op == op)
            series.append(Series(op, [float(x) for x, _ in pts], [y for _, y in pts]))
        out.append(
            line_chart(
                f"Bus bandwidth vs message size: {scope}",
                series,
                x_label="message size",
                y_label="busbw (GB/s)",
                x_fmt=fmt_bytes,
                x_log2=True,
            )
        )
    return "".join(out)


def _matrix(m: dict[str, dict[str, float]]) -> str:
    nodes = sorted(m)
    if not nodes:
        return ""
    vals = [v for a in nodes for b, v in m[a].items() if b != a]
    top = max(vals) if vals else 1.0
    rows = ["<table><tr><th>GB/s</th>" + "".join(f"<th>{escape(n)}</th>" for n in nodes) + "</tr>"]
    for a in nodes:
        cells = []
        for b in nodes:
            v = m[a].get(b)
            if v is None:
                cells.append("<td></td>")
                continue
            shade = int(255 * v / top)
            cells.append(f'<td style="background:rgb(255,{shade},{shade})">{v:.0f}</td>')
        rows.append(f"<tr><th>{escape(a)}</th>{''.join(cells)}</tr>")
    return "".join(rows) + "</table>"


def render_html(report: ValidationReport) -> str:
    """The whole report as one HTML document."""
    st = report.status.value
    out = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>gpufleet validate: {st}"
        f"</title><style>{CSS}</style></head><body>",
        f'<h1>gpufleet validate <span class="badge" style="background:{COLORS[st]}">'
        f"{st.upper()}</span></h1>",
        f"<p>engine {escape(report.engine)}, level {report.level}, "
        f"{len(report.env)} GPU(s), tests: {escape(', '.join(report.tests))}; "
        f"{report.duration_s:.0f} s of device time, {report.wall_s:.1f} s wall.</p>",
    ]
    for note in report.notes:
        out.append(f"<p><em>{escape(note)}</em></p>")
    bad = report.failures()
    out.append(
        f"<h2>Problems ({len(bad)})</h2><table><tr><th>status</th><th>test</th>"
        "<th>component</th><th>message</th></tr>"
    )
    for r in bad:
        out.append(
            f'<tr><td class="{r.status.value}">{r.status.value}</td><td>{escape(r.test)}'
            f"</td><td>{escape(r.component)}</td><td>{escape(r.message)}</td></tr>"
        )
    out.append("</table>")
    out.append(
        f"<h2>Stragglers ({len(report.stragglers)})</h2><table><tr><th>component</th>"
        "<th>test</th><th>figure</th><th>value</th><th>median</th><th>from median</th>"
        "<th>robust z</th></tr>"
    )
    for s in report.stragglers:
        out.append(
            f"<tr><td>{escape(s.component)}</td><td>{escape(s.test)}</td>"
            f"<td>{escape(s.metric)}</td><td>{s.value:.1f}</td><td>{s.median:.1f}</td>"
            f"<td>{s.deviation_pct:+.1f} %</td><td>{s.z:.1f}</td></tr>"
        )
    out.append("</table><h2>Figures per GPU</h2>")
    charts = [
        ("matmul", "bf16", "TFLOP/s"),
        ("matmul", "fp8", "TFLOP/s"),
        ("stress", "sustained_bf16", "TFLOP/s"),
        ("hbm_bandwidth", "copy", "GB/s"),
        ("pcie_bandwidth", "h2d", "GB/s"),
        ("pcie_bandwidth", "d2h", "GB/s"),
        ("targeted_power", "power", "W"),
    ]
    for test, metric, unit in charts:
        items = []
        line = None
        for r in report.results:
            m = r.metric(metric) if r.test == test else None
            if m is not None:
                items.append((r.component, m.value, m.status.value))
                line = m.pass_min or line
        out.append(_bars(f"{test} {metric}", items, unit, line))
    if report.traces:
        out.append("<h2>Stress traces</h2>" + _traces(report.traces))
    if report.collectives:
        out.append("<h2>Collectives</h2>" + _busbw_curves(report.collectives))
        out.append(
            "<h3>Largest message (nccl-tests style)</h3><table><tr>"
            "<th>scope</th><th>op</th><th>size</th><th>time us</th><th>algbw GB/s</th>"
            "<th>busbw GB/s</th></tr>"
        )
        for scope, crows in report.collectives.items():
            big = max((c.size_bytes for c in crows), default=0)
            for c in crows:
                if c.size_bytes == big:
                    out.append(
                        f"<tr><td>{escape(scope)}</td><td>{c.op}</td><td>{fmt_bytes(c.size_bytes)}"
                        f"</td><td>{c.time_us:.0f}</td><td>{c.algbw_gbps:.1f}</td>"
                        f"<td>{c.busbw_gbps:.1f}</td></tr>"
                    )
        out.append("</table>")
    if report.pair_matrix:
        matrix = _matrix(report.pair_matrix)
        out.append(f"<h2>Node-to-node bandwidth</h2><div class='scroll'>{matrix}</div>")
    out.append(
        "<h2>Environment</h2><div class='scroll'><table><tr><th>node</th><th>GPU</th><th>name</th>"
        "<th>UUID</th><th>driver</th><th>CUDA</th><th>VBIOS</th><th>status</th></tr>"
    )
    comp = report.by_component()
    for e in report.env:
        es = comp.get(f"{e.node}/gpu{e.index}", Status.PASS).value
        out.append(
            f"<tr><td>{escape(e.node)}</td><td>{e.index}</td><td>{escape(e.name)}</td>"
            f"<td>{escape(e.uuid)}</td><td>{escape(str(e.driver_version))}</td>"
            f"<td>{escape(str(e.cuda_driver_version))}</td>"
            f"<td>{escape(str(e.vbios_version))}</td><td class='{es}'>{es}</td></tr>"
        )
    out.append("</table></div></body></html>")
    return "\n".join(out)
