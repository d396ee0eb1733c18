"""``gpufleet energy report``: the controller's energy accounting (kWh, cost, CO2, idle waste)
per job, tenant, node, GPU model or day, as a table, ``--json`` or ``--csv``."""

from __future__ import annotations

import csv
import sys
from typing import Any

import typer

from gpufleet.cli.common import JsonOption
from gpufleet.cli.groups import option_groups
from gpufleet.cli.jobs import job_remote
from gpufleet.cli.output import console, emit_json
from gpufleet.cli.remote import Remote
from gpufleet.control.energy.query import BY, parse_since
from gpufleet.errors import UsageError

energy_app = typer.Typer(help="Fleet energy accounting: kWh, cost, CO2, idle waste.")
CSV_COLUMNS = (
    "key",
    "kwh",
    "cost",
    "co2_kg",
    "gpu_hours",
    "method",
    "idle_kwh",
    "idle_cost",
    "idle_gpu_hours",
)


def _num(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


@energy_app.command("report")
@option_groups(remote=job_remote)
def report(
    by: str = typer.Option("tenant", "--by", help="job, tenant, node, model or day."),
    since: str = typer.Option("30d", "--since", help="How far back: 30d, 12h, 90m, 2w."),
    as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout."),
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Energy per job, tenant, node, GPU model or day, with the fleet's idle waste."""
    if by not in BY:
        raise UsageError(f"--by {by!r}: use one of {', '.join(BY)}")
    parse_since(since)  # a bad --since is refused here, before any request
    if not remote.controller:
        raise UsageError("energy report needs --controller URL (and --token-file)")
    with remote.client() as client:
        d = client.energy(by, since).model_dump(mode="json", exclude_unset=True)
    if as_json:
        emit_json(d)
        return
    if as_csv:
        w = csv.writer(sys.stdout)
        w.writerow(CSV_COLUMNS)
        for r in [*d["rows"], {**d["total"], "key": "total"}]:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in CSV_COLUMNS])
        return
    cur = d["currency"]
    console.print(f"energy by {by} since {since}" + (f" ({cur})" if d["price_per_kwh"] else ""))
    console.print(
        f"{by:<24} {'kWh':>10} {'cost':>10} {'kg CO2':>9} {'GPU-h':>9} {'method':>8} "
        f"{'idle kWh':>9} {'idle cost':>9}"
    )
    for r in [*d["rows"], {**d["total"], "key": "total"}]:
        console.print(
            f"{str(r['key'])[:24]:<24} {_num(r['kwh']):>10} {_num(r.get('cost'), 2):>10} "
            f"{_num(r.get('co2_kg'), 2):>9} {_num(r['gpu_hours'], 2):>9} "
            f"{r['method'] or '-':>8} {_num(r['idle_kwh']):>9} {_num(r.get('idle_cost'), 2):>9}"
        )


def register(app: typer.Typer) -> None:
    app.add_typer(energy_app, name="energy")
