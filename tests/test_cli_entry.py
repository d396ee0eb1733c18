"""The command line's first step (`gpufleet.cli.entry`): a bare ``--version`` is answered
without importing the CLI (issue 27: ``--version`` <= 50 ms of CPU); anything else, ``--version``
with more words included, goes to the Typer application as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet import __version__

PROBE = (
    "import sys\n"
    "sys.argv = ['gpufleet', *sys.argv[1:]]\n"
    "from gpufleet.cli.entry import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "names = ('typer', 'rich', 'gpufleet.cli.app')\n"
    "heavy = sorted(m for m in names if m in sys.modules)\n"
    "print('imported:', ','.join(heavy) or '-')\n"
)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.process  # a fresh interpreter: this one imported Typer long ago
def test_version_is_answered_before_the_cli_is_imported() -> None:
    r = _run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"gpufleet {__version__}", "imported: -"]


@pytest.mark.process
def test_every_other_command_line_goes_to_the_typer_app() -> None:
    r = _run("--version", "--help")  # not a bare --version: the app answers (its eager option)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"gpufleet {__version__}",
        "imported: gpufleet.cli.app,rich,typer",
    ]
    bad = _run("--version", "--json")  # the app's own refusal of an unknown option
    assert "No such option: --json" in bad.stderr + bad.stdout
