"""The Typer application: registers each command module and turns gpufleet errors into one line."""

from __future__ import annotations

import importlib
import sys

import typer

from gpufleet import __version__
from gpufleet.cli.output import print_error
from gpufleet.cli.process import stop_on_sigterm
from gpufleet.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="Plan, validate and operate GPU fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One registry of command modules; each exposes ``register(app)``.
COMMAND_MODULES = (
    "gpufleet.cli.inventory",
    "gpufleet.cli.status",
    "gpufleet.cli.doctor",
    "gpufleet.cli.plan",
    "gpufleet.cli.catalog",
    "gpufleet.cli.health",
    "gpufleet.cli.agent",
    "gpufleet.cli.validate",
    "gpufleet.cli.controller",
    "gpufleet.cli.jobs",
    "gpufleet.cli.mig",
    "gpufleet.cli.config",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Plan, validate and operate GPU fleets."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    """Console-script entry point: run the app; print gpufleet errors as one line, no traceback.

    Click (inside Typer) handles usage errors and ``typer.Exit`` itself in standalone mode;
    everything gpufleet raises on purpose is a ``GpufleetError`` and is printed here.
    """
    stop_on_sigterm()  # systemd, Docker and Kubernetes stop with SIGTERM: shut down as on Ctrl-C
    try:
        app()
    except GpufleetError as exc:
        print_error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
