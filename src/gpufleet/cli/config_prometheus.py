"""`gpufleet config ...` generators for prometheus (placeholder until implemented)."""

from __future__ import annotations

import typer


def register_config(config_app: typer.Typer) -> None:
    """Attach this module's generators to the `gpufleet config` group."""
    _ = config_app
