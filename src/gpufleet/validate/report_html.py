"""A self-contained HTML report: inline SVG charts and CSS, no scripts, no external assets.

Per-GPU TFLOP/s and bandwidth bars, power/clock/temperature traces of the stress run, the
pairwise bandwidth matrix, the straggler list and the environment (driver, CUDA, VBIOS per GPU).
It opens offline in any browser.
"""

from __future__ import annotations

from html import escape

from gpufleet.validate.results import Status, TracePoint, ValidationReport

COLORS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "skip": "#757575"}
CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.pass{color:#2e7d32}.warn{color:#ef6c00}.fail{color:#c62828;font-weight:bold}.skip{color:#757575}
h1 .badge{padding:2px 10px;border-radius:4px;color:#fff}
svg{background:#fafafa;border:1px solid #ddd;margin:4px}
"""
MAX_BARS = 256


def _bars(title: str, items: list[tuple[str, float, str]], unit: str, line: float | None) -> str:
    """A horizontal-free vertical bar chart: one bar per component, coloured by status."""
    items = items[:MAX_BARS]
    if not items:
        return ""
    w, h, pad = max(300, 8 * len(items) + 60), 180, 40
    top = max(max(v for _, v, _ in items), line or 0.0) * 1.1 or 1.0
    bw = (w - pad - 10) / len(items)
    parts = [
        f'<svg width="{w}" height="{h + 30}" role="img" aria-label="{escape(title)}">',
        f'<text x="{pad}" y="14" font-size="12">{escape(title)} ({escape(unit)})</text>',
    ]
    for i, (label, v, st) in enumerate(items):
        bh = (h - 30) * v / top
        x, y = pad + i * bw, h - bh
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bw - 1, 1):.1f}" '
            f'height="{bh:.1f}" fill="{COLORS.get(st, "#555")}">'
            f"<title>{escape(label)}: {v:.1f} {escape(unit)}</title></rect>"
        )
    if line:
        y = h - (h - 30) * line / top
        parts.append(
            f'<line x1="{pad}" x2="{w - 10}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#c62828" stroke-dasharray="4"/>'
            f'<text x="{w - 120}" y="{y - 3:.1f}" font-size="10">pass line {line:.0f}</text>'
        )
    parts.append(
        f'<text x="2" y="{h:.0f}" font-size="10">0</text>'
        f'<text x="2" y="34" font-size="10">{top:.0f}</text></svg>'
    )
    return "".join(parts)


def _trace_svg(name: str, points: list[TracePoint]) -> str:
    """Power, SM clock and temperature of one GPU over the stress run (each scaled to its max)."""
    if not points:
        return ""
    w, h = 360, 140
    tmax = max(p.t_s for p in points) or 1.0
    series = [
        ("power W", "#c62828", [p.power_w for p in points]),
        ("SM MHz", "#1565c0", [float(p.sm_clock_mhz) if p.sm_clock_mhz else None for p in points]),
        ("temp C", "#ef6c00", [p.temp_c for p in points]),
    ]
    parts = [
        f'<svg width="{w}" height="{h + 20}" role="img" aria-label="trace {escape(name)}">',
        f'<text x="4" y="12" font-size="11">{escape(name)}</text>',
    ]
    for k, (label, color, vals) in enumerate(series):
        top = max((v for v in vals if v is not None), default=1.0) or 1.0
        pts = " ".join(
            f"{10 + (w - 20) * p.t_s / tmax:.1f},{h - (h - 30) * v / top:.1f}"
            for p, v in zip(points, vals, strict=True)
            if v is not None
        )
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        parts.append(
            f'<text x="{10 + 110 * k}" y="{h + 15}" font-size="10" fill="{color}">'
            f"{label} (max {top:.0f})</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


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
        out.append("<h2>Stress traces</h2>")
        for name, pts in list(report.traces.items())[:64]:
            out.append(_trace_svg(name, pts))
    if report.collectives:
        out.append(
            "<h2>Collectives (largest message, nccl-tests style)</h2><table><tr>"
            "<th>scope</th><th>op</th><th>size B</th><th>time us</th><th>algbw GB/s</th>"
            "<th>busbw GB/s</th></tr>"
        )
        for scope, crows in report.collectives.items():
            big = max((c.size_bytes for c in crows), default=0)
            for c in crows:
                if c.size_bytes == big:
                    out.append(
                        f"<tr><td>{escape(scope)}</td><td>{c.op}</td><td>{c.size_bytes}"
                        f"</td><td>{c.time_us:.0f}</td><td>{c.algbw_gbps:.1f}</td>"
                        f"<td>{c.busbw_gbps:.1f}</td></tr>"
                    )
        out.append("</table>")
    if report.pair_matrix:
        out.append("<h2>Node-to-node bandwidth</h2>" + _matrix(report.pair_matrix))
    out.append(
        "<h2>Environment</h2><table><tr><th>node</th><th>GPU</th><th>name</th>"
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
    out.append("</table></body></html>")
    return "\n".join(out)
