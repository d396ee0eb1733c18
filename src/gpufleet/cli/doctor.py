"""`gpufleet doctor`: can gpufleet talk to the GPUs here, and what to fix if not."""

from __future__ import annotations

import typer
from rich.table import Table

from gpufleet.cli.common import JsonOption, SeedOption, SimOption
from gpufleet.cli.output import console, emit_json, fit, to_jsonable
from gpufleet.devices.discovery import open_fleet
from gpufleet.devices.doctor import Check, DoctorReport, check_backend, check_environment
from gpufleet.errors import NoDeviceError

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(sim: str | None = SimOption, seed: int = SeedOption, as_json: bool = JsonOption) -> None:
    """NVML present and loadable, driver/library match, functions not found, permissions,
    persistence mode and ECC; each problem with a hint.

    Exit 0 ok, 1 warnings, 2 failures (no GPU, no NVML: a failure too), 3 bad input."""
    env = check_environment(simulated=bool(sim))
    reports: list[DoctorReport] = []
    try:
        fleet = open_fleet(sim=sim, seed=seed).bounded()
    except NoDeviceError as exc:
        env.append(Check("nvml", "fail", exc.message, exc.hint))
        fleet = None
    if fleet is not None:
        try:
            reports = [check_backend(b) for b in fleet.backends]
        finally:
            fleet.close()
    all_checks = env + [c for r in reports for c in r.checks]
    overall = (
        "fail"
        if any(c.status == "fail" for c in all_checks)
        else "warn"
        if any(c.status == "warn" for c in all_checks)
        else "ok"
    )
    if as_json:
        emit_json(
            {
                "status": overall,
                "environment": to_jsonable(env),
                "nodes": [
                    {"node": r.node, "status": r.status, "checks": to_jsonable(r.checks)}
                    for r in reports
                ],
            }
        )
    else:
        table = Table(title=f"gpufleet doctor: {overall}")
        for col in ("node", "check", "status", "detail", "hint"):
            table.add_column(col, overflow="fold", no_wrap=col in ("node", "status"))
        for c in env:
            table.add_row(
                "(host)", c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail, c.hint or ""
            )
        for r in reports:
            for c in r.checks:
                table.add_row(
                    r.node, c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail, c.hint or ""
                )
        console.print(fit(table))
    if overall != "ok":
        raise typer.Exit(2 if overall == "fail" else 1)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet doctor`."""
    app.command("doctor")(doctor)
