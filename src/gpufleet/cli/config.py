"""`gpufleet config`: generated configuration for the systems gpufleet works with.

One registry of generator modules, each exposing ``register_config(config_app)``.
"""

from __future__ import annotations

import importlib

import typer

CONFIG_MODULES = (
    "gpufleet.cli.config_agent",
    "gpufleet.cli.config_controller",
    "gpufleet.cli.config_prometheus",
    "gpufleet.cli.config_alertmanager",
    "gpufleet.cli.config_slurm",
    "gpufleet.cli.config_kubernetes",
)


def register(app: typer.Typer) -> None:
    """Attach the `gpufleet config` group and every generator in it."""
    config_app = typer.Typer(
        help="Generate configuration (systemd, Prometheus, Alertmanager, Slurm, Kubernetes).",
        no_args_is_help=True,
    )
    for name in CONFIG_MODULES:
        importlib.import_module(name).register_config(config_app)
    app.add_typer(config_app, name="config")
