"""`gpufleet checklist`: the deployment checklist of a plan, ticked from the evidence given."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.checklist import build_checklist, to_html, to_markdown
from gpufleet.checklist.inputs import load_json
from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import console, emit_json, to_jsonable
from gpufleet.errors import ConfigError, UsageError


def checklist(
    plan: Path = typer.Option(
        ..., "--plan", help="`gpufleet plan SPEC --json` output.", metavar="FILE"
    ),
    inventory: Path | None = typer.Option(
        None, "--inventory", help="`gpufleet inventory --json` output.", metavar="FILE"
    ),
    validation: list[Path] | None = typer.Option(
        None, "--validation", help="`gpufleet validate --out` result(s); repeat.", metavar="FILE"
    ),
    doctor: list[Path] | None = typer.Option(
        None, "--doctor", help="`gpufleet doctor --json` output of a node; repeat.", metavar="FILE"
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write the checklist as HTML.", metavar="FILE"
    ),
    md: Path | None = typer.Option(
        None, "--md", help="Write the checklist as Markdown.", metavar="FILE"
    ),
    as_json: bool = JsonOption,
) -> None:
    """Site (power circuits, UPS, cooling, floor load with the plan's numbers), racking,
    cabling, firmware/driver baseline, software stack, readiness per node, validation levels
    and sign-off. Items proven by a supplied file are ticked with the evidence; the rest stay
    open. Prints Markdown unless --html, --md (both at once write both files) or --json."""
    if html is not None and md is not None and html.resolve() == md.resolve():
        raise UsageError(f"--html and --md name the same file {html}: give two files")
    doc = load_json(plan, "--plan")
    inv = load_json(inventory, "--inventory") if inventory is not None else None
    vals = [(p.name, load_json(p, "--validation")) for p in validation or []]
    docs = [(p.name, load_json(p, "--doctor")) for p in doctor or []]
    result = build_checklist(doc, inv, vals, docs, where=f"--plan {plan}")
    if as_json:
        emit_json(to_jsonable(result))
        return
    targets = [(t, render) for t, render in ((html, to_html), (md, to_markdown)) if t]
    c = result.counts()
    for target, render in targets:
        try:
            target.write_text(render(result), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{target}: cannot write: {exc.strerror or exc}") from exc
        console.print(
            f"wrote {target}: {c['done']} done, {c['warn']} warn, {c['failed']} failed, "
            f"{c['open']} open",
            highlight=False,
        )
    if not targets:
        typer.echo(to_markdown(result), nl=False)


def register(app: typer.Typer) -> None:
    """Attach `gpufleet checklist`."""
    app.command("checklist")(checklist)
