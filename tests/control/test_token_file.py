"""Tokens kept off command lines: ``--token-file`` (and its env var) on every command that
takes ``--token``, and ``gpufleet token create --out`` writing a 0600 file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.cli.common import read_token
from gpufleet.errors import UsageError

runner = CliRunner()


def test_read_token_takes_the_first_line_and_refuses_ambiguity(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("  gf_abc  \nignored\n", encoding="utf-8")
    assert read_token(None, f) == "gf_abc"
    assert read_token("gf_direct", None) == "gf_direct"
    with pytest.raises(UsageError, match="not both"):
        read_token("gf_direct", f)
    (tmp_path / "empty").write_text("\n", encoding="utf-8")
    with pytest.raises(UsageError, match="empty"):
        read_token(None, tmp_path / "empty")
    with pytest.raises(UsageError, match=r"--token-file .*missing"):
        read_token(None, tmp_path / "missing")


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "list"],
        ["jobs", "submit"],
        ["jobs", "show"],
        ["jobs", "cancel"],
        ["jobs", "logs"],
        ["agent"],
        ["sim-fleet"],
    ],
)
def test_every_command_with_a_token_option_takes_a_token_file(command: list[str]) -> None:
    r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "--token-file" in r.output and "--token " in r.output


def test_token_create_out_writes_a_private_file_and_the_cli_reads_it(tmp_path: Path) -> None:
    d = str(tmp_path / "d")
    out = tmp_path / "op.token"
    r = runner.invoke(
        app,
        ["token", "create", "--role", "viewer", "--out", str(out), "--data-dir", d, "--json"],
    )
    assert r.exit_code == 0, r.output
    assert "gf_" not in r.output  # not printed
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text(encoding="utf-8").startswith("gf_")
    listed = json.loads(runner.invoke(app, ["token", "list", "--data-dir", d, "--json"]).output)
    assert [t["role"] for t in listed] == ["viewer"]
    # the jobs CLI refuses a token given twice, with one clear line
    r = runner.invoke(
        app,
        [
            "jobs",
            "list",
            "--controller",
            "http://127.0.0.1:9",
            "--token",
            "gf_x",
            "--token-file",
            str(out),
        ],
    )
    assert r.exit_code != 0 and "not both" in str(r.exception)
