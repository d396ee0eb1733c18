"""A campaign's baseline posted to the API names driver/CUDA pairs a driver can report (issue
31): ``POST /api/v1/maintenance/campaigns`` refuses an impossible pair (driver 550 with CUDA
13.0) with a 422 whose ``loc`` names ``baseline.models.<model>.cuda``, by the catalog's table
(the one simulated updates and ``load_baseline`` use: NVIDIA CUDA Toolkit Release Notes, Table
3); possible pairs and a baseline naming only a driver still start. ``gpufleet maintenance
start`` refuses the same file before it posts anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService
from gpufleet.errors import GpufleetError

CAMPAIGNS = "/api/v1/maintenance/campaigns"
CMD = "/usr/local/sbin/site-update"


def _body(models: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"baseline": {"models": models}, "update_command": CMD}


def _rig(make_service: Callable[..., ControlService]) -> tuple[TestClient, dict[str, str]]:
    svc = make_service()
    token = svc.store.tokens.create("operator", name="op")[0]
    return TestClient(create_app(svc)), {"Authorization": f"Bearer {token}"}


def test_an_impossible_pair_is_a_422_naming_the_models_cuda_and_nothing_starts(
    make_service: Callable[..., ControlService],
) -> None:
    c, h = _rig(make_service)
    cases = [
        # R550 reports CUDA 12.4 at most; 13.0 needs 580.65.06 (Table 3)
        ("550.90.07", "13.0", "CUDA 13.0 needs driver >= 580.65.06"),
        # R580 reports 13.0, its own, never an older release
        ("580.65.06", "12.4", "reports CUDA 13.0, the newest it supports, never 12.4"),
    ]
    for driver, cuda, why in cases:
        body = _body(
            {
                "a100-sxm4-80gb": {"driver": "550.90.07", "cuda": "12.4"},
                "h100-sxm": {"driver": driver, "cuda": cuda},
            }
        )
        r = c.post(CAMPAIGNS, json=body, headers=h)
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]  # only the impossible model, not the good one beside it
        assert err["loc"] == ["body", "baseline", "models", "h100-sxm", "cuda"]
        assert why in err["msg"] and f"driver {driver}" in err["msg"], err
        assert "Table 3" in err["msg"]  # the source of the rule
    assert c.get(CAMPAIGNS, headers=h).json() == []  # nothing recorded


def test_possible_pairs_and_a_driver_alone_still_start(
    make_service: Callable[..., ControlService],
) -> None:
    c, h = _rig(make_service)
    for models in (
        {"h100-sxm": {"driver": "550.90.07", "cuda": "12.4"}},
        {"h100-sxm": {"driver": "580.65.06", "cuda": "13.0"}},
        {"h100-sxm": {"driver": "550.90.07"}},  # no CUDA named: nothing to pair
        {"h100-sxm": {"cuda": "13.0"}},  # no driver named: the node's own driver decides
    ):
        r = c.post(CAMPAIGNS, json=_body(models), headers=h)
        assert r.status_code == 201, (models, r.text)
    assert len(c.get(CAMPAIGNS, headers=h).json()) == 4


def test_the_cli_refuses_the_file_naming_the_field(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(
        'models:\n  h100-sxm:\n    driver: "550.90.07"\n    cuda: "13.0"\n', encoding="utf-8"
    )
    out = CliRunner().invoke(
        app,
        [
            *("maintenance", "start", "--baseline", str(baseline), "--update-command", CMD),
            *("--controller", "http://127.0.0.1:9", "--token", "t"),  # never reached
        ],
    )
    # a GpufleetError: the entry point prints its one line (no traceback) and exits 1
    assert out.exit_code != 0 and isinstance(out.exception, GpufleetError), out.output
    text = str(out.exception)
    assert "baseline.yaml:4: models.h100-sxm.cuda" in text, text
    assert "CUDA 13.0 needs driver >= 580.65.06" in text, text
