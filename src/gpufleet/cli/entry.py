"""The command line's first step: ``gpufleet --version`` is answered before the CLI itself
(Typer, click, rich and the command modules: ~0.1 s of CPU) is imported; every other command
line goes to `gpufleet.cli.app.main`. The console script and ``python -m gpufleet`` both start
here."""

from __future__ import annotations

import sys


def main() -> None:
    """Print the version for a bare ``--version``; else run the CLI."""
    if sys.argv[1:] == ["--version"]:
        from gpufleet import __version__

        sys.stdout.write(f"gpufleet {__version__}\n")
        sys.stdout.flush()
        return
    from gpufleet.cli.app import main as run

    run()
