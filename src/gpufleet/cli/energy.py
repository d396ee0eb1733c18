"""``gpufleet energy report``: the controller's energy accounting (kWh, cost, CO2, idle waste)
per job, tenant, node, GPU model or day, as a table, ``--json`` or ``--csv``, with what the
power orders of the window saved; ``gpufleet energy progress``: a job's work done so far."""

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
    print_savings(d.get("power_orders") or [], cur)


def _money(v: float) -> str:
    """Savings are often cents: 3 significant digits below 1, else 2 decimals."""
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def _pct(v: Any) -> str:
    return "unknown" if v is None else f"{v:.1%}"


def _where(x: dict[str, Any]) -> str:
    return str(x["node"]) + ("" if x.get("gpu") is None else f" GPU {x['gpu']}")


def saving_line(sv: dict[str, Any], cur: str) -> str:
    """One order's savings in words (docs/energy.md): watts per GPU before and during, the
    energy and cost saved, the slowdown ("unknown" when its jobs reported no progress)."""
    if not sv.get("gpus"):
        why = "; ".join(_where(x) + f": {x['reason']}" for x in (sv.get("not_compared") or [])[:3])
        return "saved: unknown (no GPU to compare" + (f": {why})" if why else ")")
    cost = sv.get("cost_saved")
    out = (
        f"saved {sv['saved_kwh']:.3f} kWh"
        + ("" if cost is None else f" ({_money(cost)} {cur})")
        + f" over {sv['gpu_hours']:.2f} GPU-h, {sv['saved_kwh_per_gpu_hour']:.3f} kWh per GPU-h: "
        f"{sv['before_w']:.0f} W -> {sv['during_w']:.0f} W per GPU ({sv['gpus']} GPU(s), "
        f"basis {sv['basis']}); slowdown {_pct(sv.get('slowdown'))}"
    )
    if sv.get("slowdown") is None:
        out += " (no job progress reported)"
    elif sv["slowdown_gpus"] < sv["gpus"]:
        out += f" (from {sv['slowdown_gpus']} of {sv['gpus']} GPUs)"
    if sv.get("energy_per_work_saved") is not None:
        same = sv.get("cost_saved_same_work")
        out += (
            f"; energy per unit of work {sv['energy_per_work_saved']:.1%} less, "
            f"{sv['saved_kwh_same_work']:.3f} kWh"
            + ("" if same is None else f" ({_money(same)} {cur})")
            + " for the same work"
        )
    return out


def print_savings(orders: list[dict[str, Any]], cur: str) -> None:
    """The power orders of the window and what each saved."""
    if not orders:
        return
    console.print("power orders (mean power per GPU, the hour before vs during):")
    for o in orders:
        console.print(
            f"  order {o['order']} ({o['state']}): {saving_line(o, cur)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


@energy_app.command("progress")
@option_groups(remote=job_remote)
def progress(
    job: str = typer.Argument(..., help="The job's id (as `gpufleet jobs list` shows it)."),
    done: float = typer.Argument(..., help="Work done so far: a count that grows (samples...)."),
    unit: str = typer.Option("units", "--unit", help="What DONE counts: samples, steps, tokens."),
    *,
    remote: Remote,
    as_json: bool = JsonOption,
) -> None:
    """Report a job's progress (its work done so far): two reports give its throughput, by
    which a power order's slowdown is measured (`gpufleet energy report`, `power status`)."""
    if not remote.controller:
        raise UsageError("energy progress needs --controller URL (and --token-file)")
    if not done >= 0:
        raise UsageError(f"DONE {done!r}: expected a count of work done, 0 or more")
    with remote.client() as client:
        d = client.request(
            "POST", "/energy/progress", json={"job": job, "done": done, "unit": unit}
        )
    if as_json:
        emit_json(d)
        return
    console.print(
        f"job {job}: {done:g} {unit} recorded"
        if d.get("accepted")
        else f"job {job}: not recorded (within 10 s of its previous report)",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(energy_app, name="energy")
