"""Shared fixtures of the Kubernetes tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app


@pytest.fixture
def mig_parted(tmp_path: Path) -> Path:
    """The mig-parted config that ``gpufleet mig plan`` writes (into ``tmp_path/mig``) for 8
    H200 and a demand of 7 x 1g.18gb: what ``config kubernetes --mig-config`` reads."""
    out = tmp_path / "mig"
    demand = ["--gpus", "8xh200", "--demand", "a: 7 x 1g.18gb", "--out", str(out)]
    r = CliRunner().invoke(app, ["mig", "plan", *demand])
    assert r.exit_code == 0, r.output
    return out / "mig-parted.yaml"
