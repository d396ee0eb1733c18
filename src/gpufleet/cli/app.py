"""The Typer application: registers each command module and turns gpufleet errors into one line."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperArgument, TyperOption

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
    "gpufleet.cli.checklist",
    "gpufleet.cli.plan",
    "gpufleet.cli.catalog",
    "gpufleet.cli.health",
    "gpufleet.cli.agent",
    "gpufleet.cli.validate",
    "gpufleet.cli.controller",
    "gpufleet.cli.jobs",
    "gpufleet.cli.mig",
    "gpufleet.cli.config",
    "gpufleet.cli.maintenance",
    "gpufleet.cli.power",
    "gpufleet.cli.energy",
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

# What --help shows after an option: what a user types (N, SECONDS, FILE), never typer's
# internal tags (<bool> on a flag, <int>, <str>, <float range>).
_HELP_TYPES = {"int": "N", "float": "NUMBER", "str": "TEXT", "path": "PATH", "datetime": "TIME"}


def _help_type(self: TyperOption | TyperArgument, ctx: Any) -> str | None:
    if getattr(self, "is_flag", False) or getattr(self, "count", False):
        return None
    if self.metavar is not None:
        return self.metavar
    label = self.display_type(ctx)
    if label is None or not label.startswith("<"):
        return label
    words = label.strip("<>").split()
    if "|" in words[0]:  # a choice: the choices themselves
        return words[0]
    word = _HELP_TYPES.get(words[0].removeprefix("list[").removesuffix("]"), words[0].upper())
    return f"{word}..." if self.nargs != 1 or self.multiple else word


TyperOption.display_type_rich = _help_type  # type: ignore[method-assign]
TyperArgument.display_type_rich = _help_type  # type: ignore[method-assign,assignment]


# Commands whose exit status is a verdict (docs/cli.md "Exit codes"): 0 ok, 1 warn, 2 fail,
# 3 unknown, which is also what bad or unusable input gives them, so a Slurm health check
# never reads a typo as a failed GPU. Every other command exits 2 on bad input.
VERDICT_COMMANDS = frozenset({"health", "doctor", "validate"})
VERDICT_UNKNOWN = 3
# Errors of hostile or broken input that escaped a parser's own checks: one line, no traceback.
INPUT_FAILURES = (UnicodeDecodeError, RecursionError, MemoryError)


NOT_VERDICTS = frozenset({"ack"})  # subcommands of a verdict command that give no verdict


def is_verdict_command(argv: list[str]) -> bool:
    """Whether ``argv`` runs a verdict command (its words that are not options: the command,
    then no subcommand of `NOT_VERDICTS`)."""
    words = [a for a in argv if not a.startswith("-")]
    return bool(words) and words[0] in VERDICT_COMMANDS and not set(words[1:2]) & NOT_VERDICTS


def main() -> None:
    """Console-script entry point: run the app; print errors as one line, no traceback, and
    exit with the documented code (`VERDICT_COMMANDS`)."""
    verdict = is_verdict_command(sys.argv[1:])
    bad_input = VERDICT_UNKNOWN if verdict else 2
    stop_on_sigterm()  # systemd, Docker and Kubernetes stop with SIGTERM: shut down as on Ctrl-C
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # a bad option or argument, as click words it
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            print_error(str(exc))
        status = int(getattr(exc, "exit_code", 2))
        sys.exit(bad_input if status == 2 else status)
    except GpufleetError as exc:
        print_error(exc.message, exc.hint)
        sys.exit(VERDICT_UNKNOWN if verdict else exc.exit_code)
    except INPUT_FAILURES as exc:
        what = "input nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        print_error(f"unusable input: {type(exc).__name__}: {what}"[:300])
        sys.exit(bad_input)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
