"""Bad input to the CLI, run as a real process (``python -m gpufleet``): a fleet too big to
simulate, binary and deeply nested YAML, unknown options. Each gets one ``error:`` line (no
traceback), fast, and the exit code of docs/cli.md: verdict commands (health, doctor, validate)
exit 3 (unknown) on unusable input, every other command 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.devices.sim.spec import MAX_SIM_NODES
from gpufleet.testing.timescale import scaled
from tests.cli import run_gpufleet

pytestmark = [pytest.mark.slow, pytest.mark.process]


def gpufleet(*args: str) -> tuple[int, str, float]:
    """Exit code, stderr and seconds of one CLI run."""
    t0 = time.monotonic()
    done = run_gpufleet(*args)
    return done.returncode, done.stderr, time.monotonic() - t0


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    made = {
        "binary": d / "binary.yaml",
        "deep_list": d / "deep_list.yaml",
        "deep_map": d / "deep_map.yaml",
        "too_many": d / "too_many.yaml",
    }
    made["binary"].write_bytes(b"nodes:\n  - \xff\xfe\x00\x01\x89PNG\r\n")
    made["deep_list"].write_text("[" * 100_000 + "]" * 100_000)
    made["deep_map"].write_text("".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "x")
    made["too_many"].write_text("nodes:\n  - {model: h100-sxm, gpus: 8, count: 10000000}\n")
    return made


@pytest.mark.parametrize(("command", "code"), [("inventory", 2), ("doctor", 3), ("health", 3)])
def test_a_fleet_past_the_cap_is_refused_at_once(command: str, code: int) -> None:
    rc, err, took = gpufleet(command, "--sim", "10000000x8xh100")
    line = one_error_line(err)
    assert rc == code and f"{MAX_SIM_NODES:,}" in line and "10000000x8xh100" in line
    assert took < scaled(30)  # refused before any node is built (it ran until killed at 6 GB)


def test_a_fleet_file_past_the_cap_names_the_field(files: dict[str, Path]) -> None:
    rc, err, _ = gpufleet("inventory", "--sim", str(files["too_many"]))
    line = one_error_line(err)
    assert rc == 2 and "nodes" in line and f"{MAX_SIM_NODES:,}" in line


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("binary", "not UTF-8"),
        ("deep_list", "nested deeper than"),
        ("deep_map", "nested deeper than"),
    ],
)
@pytest.mark.parametrize(("command", "code"), [("inventory", 2), ("health", 3)])
def test_unusable_yaml_is_one_line(
    files: dict[str, Path], kind: str, problem: str, command: str, code: int
) -> None:
    rc, err, _ = gpufleet(command, "--sim", str(files[kind]))
    line = one_error_line(err)
    assert rc == code and problem in line and str(files[kind]) in line


@pytest.mark.parametrize("kind", ["binary", "deep_list"])
def test_unusable_yaml_in_other_readers(files: dict[str, Path], kind: str) -> None:
    rc, err, _ = gpufleet("plan", str(files[kind]))
    assert rc == 2 and str(files[kind]) in one_error_line(err)
    rc, err, _ = gpufleet("validate", "--sim", "1x1xh100", "--config", str(files[kind]))
    assert rc == 3 and str(files[kind]) in one_error_line(err)
    rc, err, _ = gpufleet("health", "--sim", "1x1xh100", "--config", str(files[kind]))
    assert rc == 3 and str(files[kind]) in one_error_line(err)


@pytest.mark.parametrize(("command", "code"), [("doctor", 3), ("validate", 3), ("inventory", 2)])
def test_unknown_options_follow_the_table(command: str, code: int) -> None:
    rc, err, _ = gpufleet(command, "--no-such-option")
    assert rc == code and "No such option" in err and "Traceback" not in err


def test_verdicts_keep_their_codes(tmp_path: Path) -> None:
    assert gpufleet("doctor", "--sim", "1x2xh100")[0] == 0
    fleet = tmp_path / "xid.yaml"
    fleet.write_text(
        "nodes: [{name: a, model: h100-sxm, gpus: 2}]\n"
        "faults: [{kind: xid, node: a, gpu: 0, at_s: 0, xid: 79}]\n"
    )
    rc, _, _ = gpufleet("health", "--sim", str(fleet), "--duration", "1", "--exit-code")
    assert rc == 2  # a failed GPU, told apart from unusable input (3)
