"""`gpufleet power apply|restore|status|budget --controller URL`: power limits across the fleet
(issue 16; docs/energy.md). The controller records the order, audits it per node and sends it
to the nodes' agents, which set the limits through NVML and report each GPU's outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpufleet.cli.common import JsonOption, SeedOption, SimOption, TokenFileOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.output import console, emit_json, fit
from gpufleet.cli.remote import BearerTokenOption, Remote, url_remote
from gpufleet.errors import UsageError


def parse_labels(items: list[str]) -> dict[str, str]:
    """``k=v`` options to a mapping (a clear error naming the bad one)."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UsageError(f"--label {item!r}: expected KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise UsageError(f"--gpus: expected indexes like 0,1, got {text!r}") from exc
    if not out or min(out) < 0:
        raise UsageError(f"--gpus: expected indexes like 0,1, got {text!r}")
    return out


def order_body(
    watts: float,
    *,
    gpus: str | None,
    tenant: str | None,
    partition: str | None,
    labels: list[str],
    nodes: str | None,
    revert_after: str | None,
    dry_run: bool,
) -> dict[str, Any]:
    """The ``POST /power/orders`` body of `power apply --controller`."""
    from gpufleet.control.power.spec import parse_duration

    body: dict[str, Any] = {
        "limit_w": watts,
        "gpus": parse_gpus(gpus),
        "tenant": tenant,
        "partition": partition,
        "labels": parse_labels(labels),
        "nodes": [n.strip() for n in nodes.split(",") if n.strip()] if nodes else None,
        "revert_after_s": parse_duration(revert_after) if revert_after else None,
        "dry_run": dry_run,
    }
    if not (tenant or partition or body["labels"] or body["nodes"]):
        raise UsageError("--controller needs a target: --tenant, --partition, --label or --nodes")
    return {k: v for k, v in body.items() if v is not None}


def print_order(doc: dict[str, Any]) -> None:
    """An order (or a dry run's plan) as a table, one row per node and GPU."""
    if doc.get("dry_run"):
        console.print(f"dry run: {len(doc['nodes'])} node(s) would get:", highlight=False)
        for n in doc["nodes"]:
            plan = ", ".join(f"GPU {g} {w:g} W" for g, w in n["limits"].items())
            console.print(f"  {n['node']}: {plan.replace('GPU *', 'all GPUs')}", highlight=False)
        return
    revert = doc.get("revert_at_s")
    console.print(
        f"power order {doc['id']}: [bold]{doc['state']}[/] by {doc['created_by']}"
        + ("" if revert is None else f", reverts by policy at {_when(revert)}"),
        highlight=False,
    )
    table = Table()
    for col in ("node", "apply", "restore", "GPU", "from W", "to W", "error"):
        table.add_column(col)
    for n in doc["nodes"]:
        gpus = n["gpus"] or [None]
        for g in gpus:
            table.add_row(
                n["node"],
                n["apply"],
                n["restore"] or "-",
                "-" if g is None else str(g["gpu"]),
                "-" if g is None or g["from_w"] is None else f"{g['from_w']:g}",
                "-" if g is None or g["to_w"] is None else f"{g['to_w']:g}",
                (n["error"] or "") if g is None else (g["error"] or ""),
            )
    console.print(fit(table))
    if doc.get("savings") is not None:
        from gpufleet.cli.energy import saving_line

        cur = doc["savings"].get("currency") or ""
        console.print(
            saving_line(doc["savings"], cur), markup=False, highlight=False, soft_wrap=True
        )
    held = [(n["node"], h) for n in doc["nodes"] for h in reversed(n.get("held") or [])]
    if held:  # the agents set the limits again after a reboot (or failed to)
        console.print("kept in force:", highlight=False)
        for node, h in held:
            line = f"  {node} {_when(h['at_s'])}: {h['detail']}"
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _when(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def apply_fleet(remote: Remote, **kw: Any) -> None:
    as_json = kw.pop("as_json")
    body = order_body(**kw)
    with remote.client() as c:
        doc = c.request("POST", "/power/orders", json=body)
    emit_json(doc) if as_json else print_order(doc)


def restore_fleet(remote: Remote, order: int, as_json: bool) -> None:
    with remote.client() as c:
        doc = c.request("POST", f"/power/orders/{order}/restore")
    emit_json(doc) if as_json else print_order(doc)


@option_groups(remote=url_remote)
def status_cmd(
    order: int | None = typer.Argument(None, help="Order id (default: list the newest)."),
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Show power orders and each node's and GPU's outcome (pending until its agent answers)."""
    with remote.client() as c:
        if order is not None:
            doc = c.request("GET", f"/power/orders/{order}")
            emit_json(doc) if as_json else print_order(doc)
            return
        docs = c.request("GET", "/power/orders")["orders"]
    if as_json:
        emit_json({"orders": docs})
        return
    table = Table()
    for col in ("order", "state", "by", "limits", "nodes by outcome", "saved kWh", "slowdown"):
        table.add_column(col)
    for d in docs:
        spec = d["spec"]
        limit = f"{spec['limit_w']:g} W" if "limit_w" in spec else "per GPU (budget)"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(d["by_outcome"].items()))
        sv = d.get("savings") or {}
        saved = "-" if sv.get("saved_kwh") is None else f"{sv['saved_kwh']:.3f}"
        slow = sv.get("slowdown")
        slowdown = "unknown" if slow is None else f"{slow:.1%}"
        table.add_row(str(d["id"]), d["state"], d["created_by"], limit, outcomes, saved, slowdown)
    console.print(fit(table))


def sim_gpus(sim: str, seed: int, rack: str) -> list[Any]:
    """The GPUs of a simulated fleet's rack (or row: ``r1,r2``), for a budget without a
    controller."""
    from gpufleet.devices.sim import SimFleet, parse_fleet_spec
    from gpufleet.energy.budget import BudgetGpu

    racks = {r.strip() for r in rack.split(",") if r.strip()}
    fleet = SimFleet(parse_fleet_spec(sim, seed=seed))
    out = [
        BudgetGpu(n.name, i, g.model.key)
        for n in sorted(fleet.nodes.values(), key=lambda n: n.name)
        if n.rack in racks
        for i, g in enumerate(n.gpus)
    ]
    if not out:
        raise UsageError(f"--rack {rack!r}: no node of {sim} is in it (give nodes a rack:)")
    return out


def budget_cmd(
    rack: str = typer.Option(
        ..., "--rack", help="The rack (as the controller knows it); a row: r1,r2,..."
    ),
    watts: float = typer.Option(
        ..., "--watts", min=1, help="The rack's (or row's) GPU power budget (W)."
    ),
    workload: str = typer.Option(
        "matmul-bf16", "--workload", help="Load the budget must hold: matmul-bf16, hbm."
    ),
    accept: bool = typer.Option(False, "--accept", help="Apply the proposal as a power order."),
    revert_after: str | None = typer.Option(
        None, "--revert-after", help="With --accept: put the limits back after 8h, 30m..."
    ),
    controller: str | None = typer.Option(
        None, "--controller", help="Control-plane URL (its nodes' GPUs).", metavar="URL"
    ),
    token: str | None = BearerTokenOption,
    token_file: Path | None = TokenFileOption,
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
) -> None:
    """Propose per-GPU limits keeping a rack's GPUs under a power budget with the least
    throughput lost (and apply them with --accept)."""
    from gpufleet.control.power.spec import parse_duration
    from gpufleet.energy.budget import propose

    revert_s = parse_duration(revert_after) if revert_after else None
    order = None
    if controller is None:
        if sim is None:
            raise UsageError("give --controller URL (the fleet's racks) or --sim FLEET.yaml")
        if accept:
            raise UsageError("--accept applies through the controller: give --controller URL")
        prop = propose(sim_gpus(sim, seed, rack), watts, workload).to_json(rack)
    else:
        if sim is not None:
            raise UsageError("give --controller or --sim, not both")
        with Remote(controller, token, token_file).client() as c:
            params = {"rack": rack, "watts": watts, "workload": workload}
            prop = c.request("GET", "/power/budget", params=params)
            if accept:
                body: dict[str, Any] = {"per_node": prop["per_node"]}
                if revert_s is not None:
                    body["revert_after_s"] = revert_s
                body["reason"] = f"rack {rack} budget {watts:g} W"
                order = c.request("POST", "/power/orders", json=body)
    if as_json:
        emit_json({"proposal": prop, "order": order})
        return
    table = Table(title=f"rack {rack}: {watts:g} W budget ({workload})")
    for col in ("node", "GPU", "model", "limit W", "expected W", "throughput lost"):
        table.add_column(col, justify="right")
    for a in prop["gpus"]:
        table.add_row(
            a["node"],
            str(a["gpu"]),
            a["model"],
            f"{a['limit_w']:g}",
            f"{a['expected_w']:.0f}",
            f"{a['throughput_lost']:.1%}",
        )
    console.print(fit(table))
    console.print(
        f"expected {prop['expected_w']:.0f} W of {watts:g} W (uncapped {prop['uncapped_w']:.0f}"
        f" W); throughput lost {prop['throughput_lost']:.1%}",
        highlight=False,
    )
    if order is not None:
        print_order(order)
    elif not accept:
        console.print("not applied: add --accept to apply it as a power order")
