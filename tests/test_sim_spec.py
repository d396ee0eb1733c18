"""Simulated fleet specs: short forms, YAML files, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.devices.sim import FaultKind, SimFleet, parse_fleet_spec
from gpufleet.errors import ConfigError
from tests.file_errors import assert_file_error


@pytest.mark.parametrize(
    ("text", "nodes", "gpus", "model"),
    [
        ("2x8xh100-sxm", 2, 8, "h100-sxm"),
        ("2X8XH100-SXM", 2, 8, "h100-sxm"),
        ("4xh200", 1, 4, "h200-sxm"),
        ("h100", 1, 8, "h100-sxm"),
        ("3x2xa100-sxm4-80gb", 3, 2, "a100-sxm4-80gb"),
    ],
)
def test_short_specs(text: str, nodes: int, gpus: int, model: str) -> None:
    spec = parse_fleet_spec(text)
    assert len(spec.nodes) == nodes
    assert all(n.gpus == gpus and n.model == model for n in spec.nodes)
    assert len({n.name for n in spec.nodes}) == nodes


def test_unknown_model_suggests() -> None:
    with pytest.raises(ConfigError) as err:
        parse_fleet_spec("2x8xh10-sxm")
    assert "h10-sxm" in str(err.value) and "h100-sxm" in str(err.value)


@pytest.mark.parametrize("text", ["0x8xh100", "2x0xh100", "2x8x", "x8"])
def test_bad_short_specs(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_fleet_spec(text)


def test_yaml_fleet_with_faults(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        """
seed: 3
nodes:
  - {name: a, model: h100, gpus: 8, count: 2, rack: r1}
  - {name: b, model: h200-sxm, gpus: 4, driver_version: "570.86.15"}
faults:
  - {node: a-01, gpu: 3, kind: xid, xid: 79, at_s: 10}
  - {node: b, kind: slow_gpu, fraction: 0.85}
"""
    )
    spec = parse_fleet_spec(str(f))
    assert [n.name for n in spec.nodes] == ["a-00", "a-01", "b"]
    assert spec.nodes[0].rack == "r1" and spec.nodes[2].driver_version == "570.86.15"
    assert spec.seed == 3
    assert spec.faults[0].kind == FaultKind.XID and spec.faults[0].params == {"xid": 79}
    assert spec.faults[1].gpu is None
    fleet = SimFleet(spec)
    assert all(g.slow_fraction() == 0.85 for g in fleet.node("b").gpus)
    assert fleet.node("a-00").gpus[0].slow_fraction() == 1.0


def _assert_fleet_file_error(f: Path, body: str, needle: str) -> None:
    """``body`` written to ``f`` fails to parse as a fleet file: a ConfigError that names the
    file and says ``needle``."""
    f.write_text(body)
    with pytest.raises(ConfigError) as err:
        parse_fleet_spec(str(f))
    assert needle in str(err.value)
    assert str(f) in str(err.value)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("nodes: []", "nodes: expected at least 1 item"),
        ("nodes: [{gpus: 8}]", "nodes[0]"),
        ("nodes: [{model: h100}]\nfaults: [{kind: meltdown}]", "faults[0].kind"),
        ("nodes: [{model: h100}]\nfaults: [{kind: xid, node: nope}]", "faults[0].node"),
        ("nodes: [{model: h100, name: x}, {model: h100, name: x}]", "duplicate node names"),
        ("nodes: [: bad", "not valid YAML"),
    ],
)
def test_yaml_errors_name_the_field(tmp_path: Path, body: str, needle: str) -> None:
    _assert_fleet_file_error(tmp_path / "bad.yaml", body, needle)


def test_missing_yaml_file() -> None:
    with pytest.raises(ConfigError, match="no such fleet file"):
        parse_fleet_spec("does-not-exist.yaml")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        # A string where a count belongs was a traceback (int('eight')).
        ("nodes: [{model: h100, gpus: eight}]", "nodes[0].gpus: expected a whole number"),
        ("nodes: [{model: h100, count: 0}]", "nodes[0].count: must be at least 1"),
        ("nodes: [{model: h100, gpus: 65}]", "nodes[0].gpus: must be at most 64, got 65"),
        ("seed: x\nnodes: [{model: h100}]", "seed: expected a whole number"),
        # Misspelt keys were silently ignored.
        ("nodes: [{modle: h100}]", "nodes[0].modle: unknown field 'modle' (did you mean 'model'"),
        ("sed: 3\nnodes: [{model: h100}]", "sed: unknown field 'sed'"),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: slow_gpu, fration: 0.5}]",
            "faults[0].fration: unknown field 'fration' (did you mean 'fraction'?)",
        ),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: ecc_disabled, count: 1}]",
            "takes no parameters",
        ),
        # Out-of-range values were accepted and simulated nonsense (or nothing).
        (
            "nodes: [{model: h100, name: a, gpus: 2}]\nfaults: [{node: a, gpu: 5, kind: ecc_dbe}]",
            "faults[0].gpu: node 'a' has 2 GPU(s) (0-1), not GPU 5",
        ),
        (
            "nodes: [{model: h100, name: a, gpus: 2}]\nfaults: [{gpu: 2, kind: ecc_dbe}]",
            "faults[0].gpu",
        ),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: slow_gpu, fraction: 85}]",
            "faults[0].fraction: must be at most 1.0, got 85",
        ),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: slow_gpu, fraction: x}]",
            "faults[0].fraction: expected a number",
        ),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: pcie_downgrade, gen: 9}]",
            "faults[0].gen: must be at most 6, got 9",
        ),
        (
            "nodes: [{model: h100, name: a}]\nfaults: [{node: a, kind: xid, xid: 79, at_s: -5}]",
            "faults[0].at_s: must be at least 0",
        ),
        ("nodes: [{model: h100}]\nfaults: {kind: xid}", "faults: expected a list"),
        ("nodes:\n  - {model: h100\n", "line 3: not valid YAML"),
    ],
)
def test_yaml_values_are_checked_and_errors_name_the_field(
    tmp_path: Path, body: str, needle: str
) -> None:
    _assert_fleet_file_error(tmp_path / "bad.yaml", body, needle)


def test_readme_fleet_file_still_parses(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "seed: 7\nnodes:\n"
        "  - {name: gpu-a, model: h100-sxm, gpus: 8, count: 4, rack: r01}\n"
        '  - {name: old, model: h100, gpus: 8, driver_version: "535.161.08"}\n'
        "faults:\n"
        "  - {node: gpu-a-02, gpu: 3, kind: xid, xid: 79, at_s: 10}\n"
        "  - {node: gpu-a-01, gpu: 0, kind: slow_gpu, fraction: 0.85}\n"
        "  - {node: gpu-a-00, gpu: 5, kind: pcie_downgrade, gen: 4}\n"
        "  - {node: gpu-a-03, kind: slow_link, fraction: 0.5, peer: old, duration_s: 30}\n"
    )
    spec = parse_fleet_spec(str(f))
    assert len(spec.nodes) == 5 and len(spec.faults) == 4
    assert spec.faults[3].params == {"fraction": 0.5, "peer": "old"}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a misspelt key: did-you-mean, on the key's own line
        (
            "nodes:\n  - name: a\n    model: h100\n    modle: x\n",
            ":4: nodes[0].modle: unknown field 'modle' (did you mean 'model'?)",
        ),
        # a wrong type
        (
            "seed: 3\nnodes:\n  - name: a\n    model: h100\n    gpus: eight\n",
            ":5: nodes[0].gpus: expected a whole number, got 'eight'",
        ),
        (
            "nodes:\n  - {model: h100, gpus: true}\n",
            ":2: nodes[0].gpus: expected a whole number, got True",
        ),
        # a missing required field
        ("nodes:\n  - name: a\n    gpus: 8\n", ":2: nodes[0].model: missing required field"),
        # a fault's own parameters, checked by that kind's model
        (
            "nodes: [{name: a, model: h100}]\nfaults:\n  - kind: slow_gpu\n    fration: 0.5\n",
            ":4: faults[0].fration: unknown field 'fration' (did you mean 'fraction'?)",
        ),
        (
            "nodes: [{name: a, model: h100}]\nfaults:\n  - kind: slowgpu\n",
            ":3: faults[0].kind: unknown fault kind 'slowgpu' (did you mean 'slow_gpu'?)",
        ),
    ],
)
def test_one_error_names_file_line_and_field(tmp_path: Path, body: str, expected: str) -> None:
    assert_file_error(tmp_path / "fleet.yaml", body, lambda f: parse_fleet_spec(str(f)), expected)
