"""`gpufleet maintenance plan`: order a rolling driver/firmware update against a baseline,
maintenance windows, a capacity floor and failure domains (docs/maintenance.md)."""

from __future__ import annotations

import fnmatch
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.common import ImportOption, JsonOption, SeedOption, SimOption, paths
from gpufleet.cli.output import console, emit_json, fit
from gpufleet.devices.types import NodeInventory
from gpufleet.errors import UsageError
from gpufleet.maintenance.baseline import NodeBaseline, check_fleet, load_baseline, summarize
from gpufleet.maintenance.planner import (
    CampaignNode,
    CampaignPlan,
    PlanLimits,
    StepDurations,
    batch_size,
    fraction,
    parse_select,
    plan_campaign,
)
from gpufleet.maintenance.windows import parse_schedule

maintenance_app = typer.Typer(
    help="Rolling driver, firmware and OS updates: plan and run a campaign.", no_args_is_help=True
)

SHOW_ORDER = 25  # rows of the order table on screen (--json and --html list every node)


def _matches(select: list[tuple[str, str]], attrs: dict[str, str | None]) -> bool:
    return all(fnmatch.fnmatchcase(attrs[k] or "", glob) for k, glob in select)


def _fleet(
    sim: str | None, imports: list[Path], seed: int
) -> tuple[list[NodeInventory], dict[str, str]]:
    """The inventories and each node's rack where the source knows it."""
    from gpufleet.devices.discovery import collect, open_fleet

    fleet = open_fleet(sim=sim, imports=imports, seed=seed).bounded()
    try:
        nodes, _notes = collect(fleet)
        racks: dict[str, str] = {}
        if fleet.sim is not None:
            racks = {n: s.rack for n, s in fleet.sim.nodes.items() if s.rack}
    finally:
        fleet.close()
    return nodes, racks


def plan_document(
    plan: CampaignPlan,
    status: list[NodeBaseline],
    limits: PlanLimits,
    durations: StepDurations,
    windows: list[str],
    max_failures: int,
    update_command: str | None,
) -> dict[str, Any]:
    """The JSON shape of ``maintenance plan --json``."""
    return {
        "nodes_total": len(status),
        "out_of_baseline": [
            {
                "node": s.node,
                "model": s.model,
                "changes": summarize(s.deviations),
                "verified": s.verified,
                "no_target": s.no_target,
            }
            for s in status
            if not s.compliant
        ],
        "limits": {
            "batch": limits.batch,
            "floor": limits.floor,
            "per_domain": limits.per_domain,
            "max_failures": max_failures,
        },
        "windows": windows or ["always"],
        "per_node_s": durations.total_s,
        "validate_level": durations.validate_level,
        "update_command": update_command,
        "order": [
            {
                "order": p.order,
                "node": p.name,
                "domain": p.domain,
                "start": p.start.isoformat(),
                "end": p.end.isoformat(),
            }
            for p in plan.nodes
        ],
        "not_planned": [{"node": n, "reason": r} for n, r in plan.unplannable],
        "start": plan.start.isoformat(),
        "end": plan.end.isoformat(),
        "duration_s": plan.duration_s,
        "ideal_s": plan.ideal_s,
        "serial_s": plan.serial_s,
        "parallelism": plan.parallelism,
        "windows_used": plan.windows_used,
        "min_in_service": plan.min_in_service,
        "timeline": [
            {"t": p.t.isoformat(), "in_service": p.in_service, "updating": p.updating}
            for p in plan.timeline
        ],
        "notes": plan.notes,
    }


def _human(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _print(doc: dict[str, Any]) -> None:
    out = doc["out_of_baseline"]
    console.print(f"{len(out)} of {doc['nodes_total']} node(s) out of baseline", highlight=False)
    if not doc["order"] and not doc["not_planned"]:
        console.print("[green]nothing to update[/]")
        return
    table = Table(title=f"campaign order ({len(doc['order'])} node(s))")
    for col in ("#", "node", "domain", "start (UTC)", "end (UTC)", "changes"):
        table.add_column(col)
    changes = {o["node"]: "; ".join(o["changes"]) or "no target" for o in out}
    for row in doc["order"][:SHOW_ORDER]:
        table.add_row(
            str(row["order"]),
            row["node"],
            row["domain"],
            row["start"][:16],
            row["end"][:16],
            changes.get(row["node"], ""),
        )
    console.print(fit(table))
    if len(doc["order"]) > SHOW_ORDER:
        console.print(f"... and {len(doc['order']) - SHOW_ORDER} more (--json lists all)")
    for item in doc["not_planned"]:
        console.print(f"[red]not planned:[/] {item['node']}: {item['reason']}", highlight=False)
    lim = doc["limits"]
    console.print(
        f"at most {doc['parallelism']} node(s) at once (batch {lim['batch']}, "
        f"{lim['per_domain']} per failure domain, floor {lim['floor'] * 100:.0f} %); "
        f"{_human(doc['per_node_s'])} per node (validate level {doc['validate_level']})\n"
        f"expected duration {_human(doc['duration_s'])} over {doc['windows_used']} window(s) "
        f"({', '.join(doc['windows'])}); ideal {_human(doc['ideal_s'])}; one node at a time "
        f"{_human(doc['serial_s'])}\n"
        f"lowest in-service capacity {doc['min_in_service'] * 100:.1f} %; the campaign halts "
        f"after {lim['max_failures']} failure(s)",
        highlight=False,
    )


def plan_cmd(
    baseline: Path = typer.Option(
        ..., "--baseline", help="Target versions per GPU model (YAML).", metavar="FILE"
    ),
    sim: str | None = SimOption,
    seed: int = SeedOption,
    imports: list[Path] | None = ImportOption,
    select: str | None = typer.Option(
        None,
        "--select",
        help="Only nodes matching KEY=GLOB[,...] (node, model, rack).",
        metavar="FILTER",
    ),
    batch: str = typer.Option(
        "5%",
        "--batch",
        help="Nodes in maintenance at once: a count or a % of the fleet.",
        metavar="N|PCT",
    ),
    floor: str = typer.Option(
        "90%", "--floor", help="In-service GPU capacity never below this.", metavar="PCT"
    ),
    per_domain: int = typer.Option(
        1, "--per-domain", min=1, help="Nodes of one rack in maintenance at once.", metavar="N"
    ),
    window: list[str] | None = typer.Option(
        None,
        "--window",
        help="'DAYS HH:MM-HH:MM ZONE', e.g. 'Sat 02:00-06:00 Europe/Berlin' "
        "(repeatable; default: always).",
        metavar="WINDOW",
    ),
    validate_level: int = typer.Option(
        2,
        "--validate-level",
        min=0,
        max=3,
        help="Validation after the update (0 skips).",
        metavar="LEVEL",
    ),
    max_failures: int = typer.Option(
        2,
        "--max-failures",
        min=0,
        help="Halt the campaign after this many failed nodes.",
        metavar="N",
    ),
    update_command: str | None = typer.Option(
        None,
        "--update-command",
        help="The site's update command (run by the campaign, not by plan).",
        metavar="CMD",
    ),
    drain_min: float = typer.Option(
        15, "--drain-minutes", min=0, help="Expected drain time per node.", metavar="MIN"
    ),
    update_min: float = typer.Option(
        20, "--update-minutes", min=0, help="Expected update time per node.", metavar="MIN"
    ),
    reboot_min: float = typer.Option(
        10, "--reboot-minutes", min=0, help="Expected reboot time per node.", metavar="MIN"
    ),
    start: str | None = typer.Option(
        None, "--start", help="Plan from this time (ISO 8601; default now).", metavar="TIME"
    ),
    html_out: Path | None = typer.Option(
        None, "--html", help="Write the plan as HTML (capacity timeline).", metavar="FILE"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Plan a rolling update of the nodes out of baseline: order, duration, capacity."""
    target = load_baseline(baseline)
    chooser = parse_select(select)
    schedule = parse_schedule(window)
    try:
        t0 = datetime.fromisoformat(start) if start else datetime.now(UTC)
    except ValueError:
        raise UsageError(
            f"--start {start!r}: expected an ISO 8601 time, e.g. 2026-12-05T02:00+01:00"
        ) from None
    if t0.tzinfo is None:
        t0 = t0.replace(tzinfo=UTC)
    inventories, racks = _fleet(sim, paths(imports), seed)
    status = check_fleet(inventories, target)
    by_name = {s.node: s for s in status}
    members = []
    for inv in inventories:
        s = by_name[inv.name]
        attrs = {"node": inv.name, "model": s.model, "rack": racks.get(inv.name)}
        wanted = not s.compliant and not s.no_target and _matches(chooser, attrs)
        members.append(
            CampaignNode(inv.name, len(inv.gpus), racks.get(inv.name) or inv.name, selected=wanted)
        )
    limits = PlanLimits(batch_size(batch, len(members)), fraction(floor, "--floor"), per_domain)
    durations = StepDurations(
        drain_min * 60, update_min * 60, reboot_min * 60, validate_level=validate_level
    )
    plan = plan_campaign(members, limits, schedule, durations, t0)
    if not racks:
        plan.notes.append("no rack data in this source: every node is its own failure domain")
    doc = plan_document(plan, status, limits, durations, window or [], max_failures, update_command)
    if html_out is not None:
        from gpufleet.maintenance.report_html import render_html

        try:
            html_out.write_text(render_html(plan, limits.floor), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--html {html_out}: {exc.strerror or exc}") from exc
    if as_json:
        emit_json(doc)
    else:
        _print(doc)
        for note in plan.notes:
            console.print(f"note: {note}", highlight=False)
        if html_out is not None:
            console.print(f"HTML report: {html_out}", highlight=False)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet maintenance`."""
    from gpufleet.cli.maintenance_run import register as register_run

    maintenance_app.command("plan")(plan_cmd)
    register_run(maintenance_app)
    app.add_typer(maintenance_app, name="maintenance")
