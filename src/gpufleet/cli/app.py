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

# The registry of commands: the module that registers each top-level command, so `main()`
# imports only the module a command line names. Importing all sixteen costs ~1.4 s of CPU
# (sqlalchemy, the catalog, the energy store), which `gpufleet agent` or `gpufleet health` never
# use; `--help`, no command and an unknown word import them all. tests/test_cli_registry.py holds
# this table to what the modules register.
COMMANDS: dict[str, str] = {
    "inventory": "gpufleet.cli.inventory",
    "status": "gpufleet.cli.status",
    "doctor": "gpufleet.cli.doctor",
    "checklist": "gpufleet.cli.checklist",
    "plan": "gpufleet.cli.plan",
    "catalog": "gpufleet.cli.catalog",
    "health": "gpufleet.cli.health",
    "agent": "gpufleet.cli.agent",
    "validate": "gpufleet.cli.validate",
    "up": "gpufleet.cli.controller",
    "sim-fleet": "gpufleet.cli.controller",
    "controller": "gpufleet.cli.controller",
    "token": "gpufleet.cli.controller",
    "jobs": "gpufleet.cli.jobs",
    "mig": "gpufleet.cli.mig",
    "config": "gpufleet.cli.config",
    "maintenance": "gpufleet.cli.maintenance",
    "power": "gpufleet.cli.power",
    "energy": "gpufleet.cli.energy",
    "notify": "gpufleet.cli.notify_status",
}
# One registry of command modules (each exposes ``register(app)``), in the order --help lists.
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Plan, validate and operate GPU fleets."""


def build_app(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The root Typer app with the commands of ``modules`` registered."""
    root = typer.Typer(
        name="gpufleet",
        help="Plan, validate and operate GPU fleets.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    root.callback()(_root)
    for name in modules:
        importlib.import_module(name).register(root)
    return root


def modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules a command line needs: the one its command names, or all of them
    (for `--help` at the top, no command, or a word that is not a command); none for
    `--version`."""
    words = [a for a in argv if not a.startswith("-")]
    if not words and "--version" in argv and "--help" not in argv:
        return ()
    if not words or words[0] not in COMMANDS or argv.index(words[0]) != 0:
        return COMMAND_MODULES
    return (COMMANDS[words[0]],)


_full_app: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    """``app``: every command registered (what tests and `CliRunner` drive), built once."""
    global _full_app
    if name != "app":
        raise AttributeError(name)
    if _full_app is None:
        _full_app = build_app()
    return _full_app


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
        code = build_app(modules_for(sys.argv[1:]))(standalone_mode=False)
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
