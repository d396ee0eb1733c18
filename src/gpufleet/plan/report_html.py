"""Self-contained offline HTML report: inline CSS and SVG charts (:mod:`gpufleet.svgchart`: axes
with units, human-readable values such as $84.8M); no CDN, no scripts.

One page for two readers: the money (capex, opex, TCO, cost per GPU-hour, break-even against
cloud) first, then facility and the network (fabric tiers, cables and optics by reach class).
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from gpufleet.plan.planner import CandidatePlan, Plan
from gpufleet.plan.report_sections import (
    elevations_section,
    fabric_need_section,
    plant_section,
    storage_section,
)
from gpufleet.svgchart import Fmt, Series, bar_chart, fmt_money, fmt_num, line_chart

__all__ = ["bar_chart_svg", "line_chart_svg", "render_html"]

_CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}
h1{font-size:1.6em}h2{border-bottom:2px solid #3a6;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:right}th{background:#eef5ee}td:first-child,th:first-child{text-align:left}
.kpi{display:inline-block;border:1px solid #ccc;border-radius:6px;padding:.5em 1em;margin:.3em}
.kpi b{display:block;font-size:1.4em}.note{color:#a60}svg{margin:.5em 0;max-width:100%;
height:auto}.scroll{overflow-x:auto;max-width:100%}.warning{color:#b00;font-weight:bold}"""
_COLORS = ("#3a6", "#37a", "#c63", "#a3a", "#aa3", "#3aa")


def _money(v: float | None) -> str:
    if v is None:
        return "N/A"
    return f"${v / 1e6:,.2f}M" if abs(v) >= 1e6 else f"${v:,.0f}"


def bar_chart_svg(
    title: str, items: list[tuple[str, float]], unit: str = "", fmt: Fmt = fmt_num
) -> str:
    """A horizontal bar chart with a value axis in ``unit``; no items draw nothing."""
    return bar_chart(
        title,
        [(label, v, _COLORS[i % len(_COLORS)]) for i, (label, v) in enumerate(items)],
        value_label=unit,
        value_fmt=fmt,
    )


def line_chart_svg(
    title: str,
    series: list[tuple[str, list[float]]],
    x_label: str,
    *,
    y_label: str = "USD",
    y_fmt: Fmt = fmt_money,
    markers: list[tuple[float, str]] | None = None,
) -> str:
    """Lines over a shared integer x axis (e.g. months), money on y by default, with optional
    marked x positions (the break-even month)."""
    return line_chart(
        title,
        [
            Series(name, [float(j) for j in range(len(ys))], list(ys), _COLORS[i % len(_COLORS)])
            for i, (name, ys) in enumerate(series)
        ],
        x_label=x_label,
        y_label=y_label,
        y_fmt=y_fmt,
        markers=markers or (),
    )


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _kpi(label: str, value: str) -> str:
    return f'<div class="kpi">{escape(label)}<b>{escape(value)}</b></div>'


def _money_section(cp: CandidatePlan) -> str:
    c = cp.cost
    assert c is not None
    out = [
        "<h2>Money</h2>",
        _kpi("Capex", _money(c.capex)),
        _kpi("Opex per year", _money(c.opex_per_year)),
        _kpi(f"TCO over {c.horizon_years:g} years", _money(c.tco)),
        _kpi(
            f"Cost per GPU-hour at {c.utilization:.0%} use",
            "N/A" if c.cost_per_gpu_hour is None else f"${c.cost_per_gpu_hour:.2f}",
        ),
        _kpi(
            "Owning beats cloud from",
            "N/A"
            if c.cloud_per_gpu_hour is None
            else f"month {c.breakeven_month}"
            if c.breakeven_month
            else "never",
        ),
    ]
    out.append(
        _table(
            ["part", "USD"],
            [
                ["servers (capex)", _money(c.servers_capex)],
                ["network (capex)", _money(c.network_capex)],
                ["energy per year (incl. cooling via PUE)", _money(c.energy_per_year)],
                ["support per year", _money(c.support_per_year)],
                ["space per year", _money(c.space_per_year)],
            ],
        )
    )
    if c.capex is not None and c.cloud_per_month is not None:
        months = int(c.horizon_years * 12)
        if c.breakeven_month and c.breakeven_month > months - 3:
            months = c.breakeven_month + 6  # draw far enough to show where the lines cross
        own = [c.capex + c.opex_per_year / 12 * m for m in range(months + 1)]
        cloud = [c.cloud_per_month * m for m in range(months + 1)]
        marks = (
            [(float(c.breakeven_month), f"break-even: month {c.breakeven_month}")]
            if c.breakeven_month
            else []
        )
        out.append(
            line_chart_svg(
                "Cumulative cost: own vs cloud",
                [("own", own), ("cloud", cloud)],
                f"months ({c.horizon_years:g}-year horizon = month {int(c.horizon_years * 12)})",
                y_label="cumulative cost (USD)",
                markers=marks,
            )
        )
    return "".join(out)


def _facility_section(cp: CandidatePlan) -> str:
    f = cp.facility
    assert f is not None
    rows = [
        ["servers", f"{cp.servers} x {cp.server.name} ({f.server_kw:g} kW each)"],
        [
            "racks",
            f"{f.racks} ({f.servers_per_rack} per rack, "
            f"limited by {f.servers_per_rack_limited_by})",
        ],
        ["rack load", f"{f.rack_load_kw:.1f} kW of {f.rack_limit_kw:g} kW limit"],
        [
            "circuits",
            f"{f.circuits_per_rack} per rack at {f.circuit_kw:.1f} kW ({f.redundancy}); "
            f"{f.pdus} PDUs",
        ],
        ["IT power", f"{f.it_kw:,.1f} kW (network {f.network_it_kw:,.1f} kW)"],
        ["facility power", f"{f.facility_kw:,.1f} kW at PUE {f.pue}"],
        [
            "heat load",
            f"{f.heat_load_kw:,.1f} kW = {f.heat_load_tons:,.1f} tons ({f.cooling} cooling)",
        ],
        ["energy", f"{f.annual_mwh:,.0f} MWh per year"],
        [
            "rack weight",
            "not known (see the notes)"
            if f.rack_weight_kg is None
            else f"{f.rack_weight_kg:,.1f} kg per full rack ({f.servers_per_rack} x "
            f"{f.server_weight_kg:g} kg + {f.rack_tare_kg:g} kg enclosure)",
        ],
        [
            "floor loading",
            "not known"
            if f.floor_load_kg_m2 is None
            else f"{f.floor_load_kg_m2:,.0f} kg/m^2 over {f.rack_footprint_m2:.2f} m^2 "
            f"(floor rating {f.floor_rating_kg_m2:,.0f} kg/m^2"
            + (", exceeded)" if f.floor_overloaded else ")"),
        ],
    ]
    chart = bar_chart_svg(
        "Power",
        [
            ("servers", f.servers_it_kw),
            ("network", f.network_it_kw),
            ("cooling/losses", f.cooling_overhead_kw),
        ],
        "kW",
    )
    return "<h2>Facility</h2>" + _table(["item", "value"], rows) + chart


def _network_section(cp: CandidatePlan) -> str:
    fab = cp.fabric
    assert fab is not None
    trees = [
        [
            n,
            str(t.endpoints),
            str(t.levels),
            str(t.leaves),
            str(t.spines),
            str(t.cores),
            str(t.endpoint_links),
            str(t.leaf_spine_links),
            str(t.spine_core_links),
        ]
        for n, t in (("compute", fab.compute), ("storage", fab.storage), ("in-band", fab.inband))
    ]
    cables = [
        [
            c.network,
            c.tier,
            c.medium,
            f"{c.length_m:g}",
            str(c.count),
            c.transceiver or "-",
            str(c.transceivers),
            c.fibre or "-",
        ]
        for c in fab.cables
    ]
    return (
        "<h2>Network</h2>"
        + _table(
            [
                "network",
                "endpoints",
                "levels",
                "leaf",
                "spine",
                "core",
                "endpoint links",
                "leaf-spine",
                "spine-core",
            ],
            trees,
        )
        + f"<p>Out-of-band: {fab.oob_switches} x 48-port 1GbE switches, {fab.oob_links} ports.</p>"
        + _table(
            [
                "network",
                "tier",
                "medium",
                "length m",
                "cables",
                "transceiver",
                "transceivers",
                "fibre",
            ],
            cables,
        )
    )


def render_html(plan: Plan) -> str:
    """The whole report as one HTML string."""
    best = plan.best
    assert best is not None
    feasible = [c for c in plan.candidates if c.feasible]
    comp_rows = [
        [
            c.candidate,
            str(c.gpus),
            str(c.servers),
            "N/A" if c.training_days is None else f"{c.training_days:.1f}",
            "N/A" if c.run_energy_mwh is None else f"{c.run_energy_mwh:,.0f}",
            _money(c.cost.tco if c.cost else None),
            "N/A" if c.tokens_per_joule is None else f"{c.tokens_per_joule:.3f}",
            "N/A" if c.cost_per_million_tokens is None else f"${c.cost_per_million_tokens:.3f}",
            "ok" if c.feasible else f"infeasible: {c.problem}",
        ]
        for c in plan.candidates
    ]
    chart_defs: tuple[tuple[str, Callable[[CandidatePlan], float | None], str, Fmt], ...] = (
        ("TCO", lambda c: c.cost.tco if c.cost else None, "USD", fmt_money),
        ("Training days", lambda c: c.training_days, "days", fmt_num),
        ("GPUs", lambda c: float(c.gpus), "GPUs", fmt_num),
        (
            "Facility power",
            lambda c: c.facility.facility_kw if c.facility else None,
            "kW",
            fmt_num,
        ),
    )
    # a chart only when some candidate has the figure (an inference plan has no training days)
    charts = "".join(
        bar_chart_svg(
            title, [(c.candidate, v) for c in feasible if (v := get(c)) is not None], unit, fmt
        )
        for title, get, unit, fmt in chart_defs
    )
    work = []
    for w in best.workloads:
        if w.training:
            m = w.training.memory
            work.append(
                [
                    w.name,
                    "training",
                    str(w.gpus),
                    f"tp {m.tensor_parallel} pp {m.pipeline_parallel} dp {m.data_parallel}; "
                    f"{m.total_bytes / 1e9:.1f} GB/GPU; {w.training.days:.1f} days "
                    f"({w.training.days_range[0]:.1f}-{w.training.days_range[1]:.1f})",
                ]
            )
        elif w.inference:
            i = w.inference
            work.append(
                [
                    w.name,
                    "inference",
                    str(w.gpus),
                    f"{i.replicas} x {i.gpus_per_replica} GPUs; {i.decode_tokens_per_s:,.0f} "
                    f"tokens/s ({i.decode_bound} bound)",
                ]
            )
        elif w.hpc:
            h = w.hpc
            work.append(
                [
                    w.name,
                    f"hpc ({h.precision})",
                    str(w.gpus),
                    f"{h.sustained_tflops:,.0f} TFLOP/s sustained ({h.peak_path} "
                    f"{h.peak_tflops:g} x {h.efficiency:.0%}); bound by {h.bound}",
                ]
            )
        else:
            work.append([w.name, w.kind, str(w.gpus), "given"])
    notes = "".join(f'<li class="note">{escape(n)}</li>' for n in best.notes)
    warned = "".join(f'<li class="warning">{escape(w)}</li>' for w in best.warnings)
    assumptions = "".join(f"<li>{escape(a)}</li>" for a in plan.assumptions)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(plan.name)}'
        f"</title><style>{_CSS}</style></head><body><h1>GPU fleet plan: {escape(plan.name)}</h1>"
        f"<p>Chosen: <b>{escape(best.candidate)}</b> ({escape(best.server.name)}), "
        f"{best.gpus} GPUs "
        f"in {best.servers} servers.</p>"
        + _money_section(best)
        + "<h2>Workloads</h2>"
        + _table(["workload", "kind", "GPUs", "sizing"], work)
        + "<h2>Candidates</h2>"
        + _table(
            [
                "candidate",
                "GPUs",
                "servers",
                "days",
                "run MWh",
                "TCO",
                "tokens/J",
                "USD/M tokens",
                "status",
            ],
            comp_rows,
        )
        + charts
        + _facility_section(best)
        + plant_section(best)
        + storage_section(best)
        + _network_section(best)
        + fabric_need_section(best)
        + elevations_section(best)
        + (f"<h2>Warnings</h2><ul>{warned}</ul>" if warned else "")
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + f"<h2>Assumptions and sources</h2><ul>{assumptions}</ul>"
        + "<p>Formulas and their sources: see docs/plan.md.</p></body></html>"
    )
