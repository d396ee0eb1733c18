"""Options shared by the commands (``--sim``, ``--seed``, ``--import``, ``--json``, and how a
token is given: ``--token-file``/``GPUFLEET_TOKEN_FILE`` preferred over ``--token``, which shows
in ``ps``)."""

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
    """Check an ``http(s)://HOST[:PORT]`` option value (or a comma-separated list of them: the
    control plane's replicas, `gpufleet.replicas`); returns it unchanged."""
    if "," in value:
        for one in value.split(","):
            http_url(one.strip(), option)
        return value
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise UsageError(f"{option} {value!r}: expected a URL like https://HOST:PORT")
    return value


TOKEN_FILE_HELP = "Read the token from this file (preferred: a --token shows in `ps`)."
TokenFileOption = typer.Option(
    None, "--token-file", envvar="GPUFLEET_TOKEN_FILE", help=TOKEN_FILE_HELP, metavar="FILE"
)


def read_token(token: str | None, token_file: Path | None, option: str = "--token") -> str | None:
    """The token given by ``--token`` (or its env var) or ``--token-file`` (first line, blanks
    stripped); a clear error for both at once, an unreadable or empty file."""
    if token_file is None:
        return token or None
    if token:
        raise UsageError(f"give {option} or --token-file, not both")
    try:
        text = token_file.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"--token-file {token_file}: {why}") from exc
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise UsageError(f"--token-file {token_file}: the file is empty")
    return lines[0].strip()
