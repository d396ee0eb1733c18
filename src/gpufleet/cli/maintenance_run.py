"""`gpufleet maintenance start|status|pause|resume|abort`: run a campaign on a controller
(issue 15; docs/maintenance.md). ``start`` takes the plan's options; the controller selects
the nodes out of baseline from what their agents report and runs the campaign on its loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.common import JsonOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json, fit
from gpufleet.cli.remote import Remote, url_remote
from gpufleet.errors import UsageError
from gpufleet.maintenance.planner import fraction
from gpufleet.maintenance.windows import parse_schedule

CampaignOpt = typer.Option(
    None, "--campaign", help="Campaign id (default: the newest).", metavar="ID"
)


def _batch(value: str) -> tuple[int | None, float | None]:
    """``5%`` (a fraction, turned into nodes by the controller's fleet) or a count."""
    text = value.strip()
    if text.endswith("%"):
        return None, fraction(text, "--batch")
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--batch {value!r}: expected a node count >= 1 or a percentage")
    return n, None


def _print(doc: dict[str, Any]) -> None:
    cap = doc["capacity"]  # None for a tenant's token: the fleet's capacity is not its to read
    frac = cap["in_service_fraction"] if cap else None
    in_service = f"{cap['in_service_gpus']}/{cap['fleet_gpus']} GPUs" if cap else "N/A"
    console.print(
        f"campaign {doc['id']}: [bold]{doc['state']}[/] {doc['reason']}\n"
        f"failures {doc['failures']}/{doc['max_failures']}, batch {doc['batch']}, floor "
        f"{doc['floor'] * 100:.0f} %, windows {', '.join(doc['windows'])}\n"
        f"in service now: {in_service}"
        + (f" ({frac * 100:.1f} %)" if frac is not None else "")
        + "; steps: "
        + ", ".join(f"{k} {v}" for k, v in sorted(doc["by_step"].items())),
        highlight=False,
    )
    rq = doc.get("requeued") or {}
    if rq.get("nodes"):
        console.print(
            f"drain deadline: {rq['nodes']} node(s); jobs requeued after the checkpoint signal "
            f"{rq['signalled']}, killed without it {rq['killed']}",
            highlight=False,
        )
    table = Table()
    for col in ("#", "node", "domain", "step", "reason"):
        table.add_column(col)
    for n in doc["nodes"]:
        table.add_row(str(n["order"]), n["node"], n["domain"], n["step"], n["reason"])
    if doc["nodes"]:
        console.print(fit(table))


def _show(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(doc)
    else:
        _print(doc)


@option_groups(remote=url_remote)
def start_cmd(
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Target versions per GPU model (YAML).", metavar="FILE"
    ),
    update_command: str | None = typer.Option(
        None,
        "--update-command",
        help="The site's update command, run on each node by its agent (its own unit).",
        metavar="CMD",
    ),
    *,
    remote: Remote,
    select: str | None = typer.Option(
        None, "--select", help="Only nodes matching KEY=GLOB[,...] (node, model, rack)."
    ),
    batch: str = typer.Option("5%", "--batch", help="Nodes at once: a count or a % of nodes."),
    floor: str = typer.Option("90%", "--floor", help="In-service GPU capacity never below."),
    per_domain: int = typer.Option(1, "--per-domain", min=1, help="Nodes of one rack at once."),
    window: list[str] | None = typer.Option(
        None, "--window", help="'DAYS HH:MM-HH:MM ZONE' (repeatable; default: always)."
    ),
    validate_level: int = typer.Option(
        1,
        "--validate-level",
        min=0,
        max=3,
        help="0: none; 1: the agent's gate; 2, 3: the agent runs gpufleet validate --level N.",
    ),
    max_failures: int = typer.Option(2, "--max-failures", min=0, help="Halt after N failures."),
    update_timeout: float = typer.Option(
        60, "--update-timeout-minutes", min=0.01, help="The update command's timeout."
    ),
    drain_timeout: float = typer.Option(
        60, "--drain-timeout-minutes", min=0.01, help="A drain not done by then: node skipped."
    ),
    back_timeout: float = typer.Option(
        30, "--back-timeout-minutes", min=0.01, help="Node back after its update within this."
    ),
    drain_deadline: float | None = typer.Option(
        None,
        "--drain-deadline-minutes",
        min=0.01,
        help="Jobs still running then get the checkpoint signal and are requeued "
        "(default 30, or half the drain timeout when that is shorter).",
    ),
    no_deadline: bool = typer.Option(
        False, "--no-drain-deadline", help="Never signal jobs: wait for them (drain timeout)."
    ),
    checkpoint_signal: str = typer.Option(
        "USR1", "--checkpoint-signal", help="The signal jobs get at the deadline (USR1, TERM...)."
    ),
    checkpoint_grace: float = typer.Option(
        60, "--checkpoint-grace-seconds", min=0, help="Time to exit after the signal."
    ),
    as_json: bool = JsonOption,
    proposal: int | None = typer.Option(
        None,
        "--proposal",
        min=1,
        help="Start the campaign the maintenance policy proposed (its id; no other option).",
        metavar="ID",
    ),
) -> None:
    """Start a campaign on the controller over the nodes out of baseline."""
    if proposal is not None:
        if baseline is not None or update_command is not None:
            raise UsageError("--proposal starts the proposed campaign as it is: no --baseline")
        with remote.client() as client:
            doc = client.request("POST", f"/maintenance/campaigns/{proposal}/start")
        _show(doc, as_json)
        return
    if baseline is None or update_command is None:
        raise UsageError("give --baseline FILE and --update-command CMD (or --proposal ID)")
    from gpufleet.maintenance.baseline import load_baseline
    from gpufleet.maintenance.planner import parse_select

    target = load_baseline(baseline)
    parse_schedule(window)  # a bad window is refused here, with its text
    count, share = _batch(batch)
    body: dict[str, Any] = {
        "baseline": target.model_dump(mode="json", exclude_none=True),
        "select": parse_select(select),
        "floor": fraction(floor, "--floor"),
        "per_domain": per_domain,
        "windows": window or [],
        "max_failures": max_failures,
        "update_command": update_command,
        "update_timeout_s": update_timeout * 60,
        "drain_timeout_s": drain_timeout * 60,
        "back_timeout_s": back_timeout * 60,
        "validate_level": validate_level,
        "checkpoint_signal": checkpoint_signal.upper(),
        "checkpoint_grace_s": checkpoint_grace,
    }
    if no_deadline:
        body["drain_deadline_s"] = None
    elif drain_deadline is not None:
        body["drain_deadline_s"] = drain_deadline * 60
    with remote.client() as c:
        if share is not None:
            nodes = c.request("GET", "/summary").get("nodes") or 0
            import math

            count = max(1, math.floor(int(nodes) * share))
        body["batch"] = count
        doc = c.request("POST", "/maintenance/campaigns", json=body)
    _show(doc, as_json)


@option_groups(remote=url_remote)
def status_cmd(
    *, remote: Remote, campaign: int | None = CampaignOpt, as_json: bool = JsonOption
) -> None:
    """A campaign's state, capacity now and every node's step (viewers may read it)."""
    path = f"/maintenance/campaigns/{campaign}" if campaign else "/maintenance/campaigns/latest"
    with remote.client() as c:
        doc = c.request("GET", path)
    _show(doc, as_json)


def _control(action: str) -> Any:
    @option_groups(remote=url_remote)
    def cmd(
        *, remote: Remote, campaign: int | None = CampaignOpt, as_json: bool = JsonOption
    ) -> None:
        with remote.client() as c:
            cid = campaign or c.request("GET", "/maintenance/campaigns/latest")["id"]
            doc = c.request("POST", f"/maintenance/campaigns/{cid}/{action}")
        _show(doc, as_json)

    cmd.__doc__ = {
        "pause": "Start no new node (nodes in flight finish).",
        "resume": "Start nodes again after a pause.",
        "abort": "End the campaign: nodes not yet updated go back to service; nodes in their "
        "update finish it.",
    }[action]
    return cmd


def register(app: typer.Typer) -> None:
    """Attach start/status/pause/resume/abort to `gpufleet maintenance`."""
    app.command("start")(start_cmd)
    app.command("status")(status_cmd)
    for action in ("pause", "resume", "abort"):
        app.command(action)(_control(action))
