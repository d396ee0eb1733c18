"""Options shared by the device commands (``--sim``, ``--seed``, ``--import``, ``--json``)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.errors import UsageError

SIM_HELP = "Simulated fleet: NODESxGPUSxMODEL (e.g. 2x8xh100-sxm) or a YAML fleet file."

SimOption = typer.Option(None, "--sim", help=SIM_HELP, metavar="SPEC")
SeedOption = typer.Option(7, "--seed", help="Seed of the simulated fleet (identities, faults).")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of tables.")
ImportOption = typer.Option(
    None, "--import", help="nvidia-smi -q -x report(s), one per node.", exists=False, metavar="FILE"
)


def paths(values: list[Path] | None) -> list[Path]:
    return list(values or [])


def host_port(value: str, option: str) -> str:
    """Check a ``HOST:PORT`` option value (port 1-65535); returns it unchanged."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"{option} {value!r}: expected HOST:PORT with a port 1-65535")
    return value


def http_url(value: str, option: str) -> str:
    """Check an ``http(s)://HOST[:PORT]`` option value; returns it unchanged."""
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise UsageError(f"{option} {value!r}: expected a URL like https://HOST:PORT")
    return value
