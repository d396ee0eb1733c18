"""The CLI's command table: `main()` imports only the module a command names, so the table
must say exactly which module registers each top-level command."""

from __future__ import annotations

import importlib

import typer

from gpufleet.cli import app as cli_app


def _registered(module: str) -> set[str]:
    probe = typer.Typer()
    importlib.import_module(module).register(probe)
    names = {c.name or c.callback.__name__ for c in probe.registered_commands if c.callback}
    names |= {g.name or g.typer_instance.info.name for g in probe.registered_groups}  # type: ignore[misc,union-attr]
    return names


def test_every_registered_command_is_in_the_table_under_its_module() -> None:
    for module in cli_app.COMMAND_MODULES:
        for name in _registered(module):
            assert cli_app.COMMANDS.get(name) == module, f"{name} (registered by {module})"


def test_the_table_names_no_command_its_module_does_not_register() -> None:
    for name, module in cli_app.COMMANDS.items():
        assert module in cli_app.COMMAND_MODULES, module
        assert name in _registered(module), f"{module} registers no {name}"


def test_a_command_line_imports_only_the_module_its_command_names() -> None:
    assert cli_app.modules_for(["agent", "run", "--sim", "1x8xh100"]) == ("gpufleet.cli.agent",)
    assert cli_app.modules_for(["token", "create"]) == ("gpufleet.cli.controller",)
    assert cli_app.modules_for(["--version"]) == ()


def test_help_no_command_and_unknown_words_import_every_module() -> None:
    for argv in ([], ["--help"], ["frobnicate"], ["--version", "agent"], ["--version", "--help"]):
        assert cli_app.modules_for(argv) == cli_app.COMMAND_MODULES, argv


def test_the_full_app_and_a_one_command_app_answer_the_same_help() -> None:
    from typer.testing import CliRunner

    runner = CliRunner()
    full = runner.invoke(cli_app.build_app(), ["health", "--help"])
    one = runner.invoke(cli_app.build_app(("gpufleet.cli.health",)), ["health", "--help"])
    assert full.exit_code == one.exit_code == 0
    assert full.output == one.output
