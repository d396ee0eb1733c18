"""Options shared by the device commands (``--sim``, ``--seed``, ``--import``, ``--json``)."""

from __future__ import annotations

from pathlib import Path

import typer

SIM_HELP = "Simulated fleet: NODESxGPUSxMODEL (e.g. 2x8xh100-sxm) or a YAML fleet file."

SimOption = typer.Option(None, "--sim", help=SIM_HELP, metavar="SPEC")
SeedOption = typer.Option(7, "--seed", help="Seed of the simulated fleet (identities, faults).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of tables.")
ImportOption = typer.Option(
    None, "--import", help="nvidia-smi -q -x report(s), one per node.", exists=False, metavar="FILE"
)


def paths(values: list[Path] | None) -> list[Path]:
    return list(values or [])
