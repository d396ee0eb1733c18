"""The baseline file and the nodes out of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.devices.discovery import node_inventory, open_fleet
from gpufleet.devices.types import NodeInventory
from gpufleet.errors import ConfigError
from gpufleet.maintenance.baseline import check_fleet, load_baseline, summarize


def sim_nodes(spec: str) -> list[NodeInventory]:
    fleet = open_fleet(sim=spec)
    try:
        return [node_inventory(b)[0] for b in fleet.backends]
    finally:
        fleet.close()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "baseline.yaml"
    p.write_text(text)
    return p


def test_nodes_off_the_target_driver_are_listed_per_gpu(tmp_path: Path) -> None:
    nodes = sim_nodes("3x8xh100-sxm")
    current = nodes[0].gpus[0].driver_version
    assert current is not None
    # node 1 runs the target everywhere; node 2 has one GPU whose driver reads as unknown
    nodes[1] = replace(
        nodes[1], gpus=tuple(replace(g, driver_version="999.1") for g in nodes[1].gpus)
    )
    g = list(nodes[2].gpus)
    g[3] = replace(g[3], driver_version=None)
    nodes[2] = replace(
        nodes[2], gpus=tuple(replace(x, driver_version="999.1") if x.index != 3 else x for x in g)
    )
    baseline = load_baseline(write(tmp_path, 'models:\n  h100-sxm:\n    driver: "999.1"\n'))
    status = check_fleet(nodes, baseline)
    assert [s.compliant for s in status] == [False, True, False]
    assert len(status[0].deviations) == 8
    assert {d.found for d in status[0].deviations} == {current}
    assert summarize(status[0].deviations) == [f"driver {current} -> 999.1 (GPU 0-7)"]
    unknown = status[2].deviations
    assert [(d.gpu, d.status) for d in unknown] == [(3, "unknown")]
    assert not status[2].verified


def test_a_model_without_target_is_not_out_of_baseline_but_flagged(tmp_path: Path) -> None:
    nodes = sim_nodes("1x8xh200-sxm")
    baseline = load_baseline(write(tmp_path, "models:\n  h100-sxm:\n    driver: '1'\n"))
    (s,) = check_fleet(nodes, baseline)
    assert s.no_target and not s.compliant and not s.deviations


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "models:\n  h100-sx:\n    driver: '1'\n",
            "baseline.yaml:2: models.h100-sx: unknown GPU model 'h100-sx'"
            " (did you mean 'h100-sxm'?)",
        ),
        ("models:\n  h100-sxm:\n    drivr: '1'\n", "baseline.yaml:3: models.h100-sxm.drivr"),
        ("models:\n  h100-sxm: {}\n", "no target version given"),
        ("modles: {}\n", "modles"),
    ],
)
def test_bad_baselines_name_file_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_baseline(write(tmp_path, text))
    assert needle in str(err.value)
