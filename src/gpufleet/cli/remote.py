"""A command's control-plane options (--controller, --token[-file], --ca) as one `Remote`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli.common import TokenFileOption, read_token
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.client import Client

ControllerUrlOption = typer.Option(..., "--controller", help="Control-plane URL.", metavar="URL")
BearerTokenOption = typer.Option(None, "--token", envvar="GPUFLEET_TOKEN", help="Bearer token.")


def client(controller: str, token: str | None, ca: Path | None = None) -> Client:
    """The control-plane client for ``--controller``/``--token`` (``--ca``: the PEM bundle to
    verify an https controller with)."""
    from gpufleet.client import Client

    if not token:
        raise UsageError(
            "--controller needs --token-file (or GPUFLEET_TOKEN_FILE, GPUFLEET_TOKEN, --token)"
        )
    if ca is not None and not ca.is_file():
        raise UsageError(f"--ca {ca}: no such file")
    return Client(controller, token, ca=ca)


@dataclass(frozen=True)
class Remote:
    """The control-plane options a command was given, as an option group's builder
    (`gpufleet.cli.groups`) gathers them: ``controller`` None when none was given. The token
    is read only when a client is made, so the command checks its other options first."""

    controller: str | None
    token: str | None
    token_file: Path | None
    ca: Path | None = None

    def client(self) -> Client:
        """The client for ``--controller`` with the token of ``--token`` or ``--token-file``."""
        if self.controller is None:
            raise UsageError("give --controller URL")
        return client(self.controller, read_token(self.token, self.token_file), self.ca)


def url_remote(
    controller: str = ControllerUrlOption,
    token: str | None = BearerTokenOption,
    token_file: Path | None = TokenFileOption,
) -> Remote:
    """The option group of a command that only talks to a controller: ``--controller URL``
    (needed) and its token."""
    return Remote(controller, token, token_file)
