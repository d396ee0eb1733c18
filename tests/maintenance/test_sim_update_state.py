"""The simulated update keeps the fleet file as the user wrote it and leaves consistent
versions (issue 31): the node's new state lives in the simulator's state directory, the node
reports the CUDA version its new driver supports, and a driver/CUDA pair no driver reports is
refused, in the update and in a baseline.

Expected pairs are typed from NVIDIA's CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and
Corresponding Driver Versions" (Linux x86_64, the GA row of each release): 11.4 GA >= 470.42.01,
12.0 GA >= 525.60.13, 12.2 GA >= 535.54.03, 12.4 GA >= 550.54.14, 12.6 GA >= 560.28.03,
12.8 GA >= 570.26, 12.9 GA >= 575.51.03, 13.0 GA >= 580.65.06, 13.1 GA >= 590.44.01; every driver
of a branch reports its branch's CUDA version (nvidia-smi's "CUDA Version": an R550 driver
says 12.4, R580 says 13.0)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.devices.sim.update import main as sim_update
from gpufleet.errors import ConfigError
from gpufleet.maintenance.baseline import load_baseline

OLD = "535.104.05"  # R535: CUDA 12.2
FLEET = f"""\
# my fleet: hand-written, with comments the update must not lose
seed: 7
nodes:
  - {{name: a, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
  - {{name: b, model: h100-sxm, gpus: 2, driver_version: "{OLD}"}}
  - {{name: grp, model: h100-sxm, gpus: 2, count: 2, driver_version: "{OLD}"}}
faults:
  - {{node: grp-01, gpu: 1, kind: update_gpu_lost}}
"""


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sim-state"
    monkeypatch.setenv("GPUFLEET_SIM_STATE_DIR", str(root))
    monkeypatch.delenv("GPUFLEET_AGENT_PID", raising=False)
    monkeypatch.delenv("GPUFLEET_NODE", raising=False)
    return root


def fleet_file(tmp_path: Path) -> Path:
    f = tmp_path / "fleet.yaml"
    f.write_text(FLEET, encoding="utf-8")
    return f


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions(f: Path, node: str) -> tuple[str | None, str | None]:
    """(driver, CUDA) the node reports through NVML, the fleet file read again (what an agent
    restarted after its update opens)."""
    sim = SimFleet(parse_fleet_spec(str(f)))
    info = sim.node(node).backend().device_info(0)
    return info.driver_version, info.cuda_driver_version


def test_the_fleet_file_is_not_written_and_the_node_has_the_new_driver(
    tmp_path: Path, _state: Path
) -> None:
    f = fleet_file(tmp_path)
    before, mtime = digest(f), f.stat().st_mtime_ns
    assert versions(f, "a") == (OLD, "12.2")  # R535 reports 12.2, not the simulator's 13.0
    assert sim_update(["--fleet", str(f), "--node", "a", "--driver", "570.86.15"]) == 0
    assert digest(f) == before and f.stat().st_mtime_ns == mtime
    assert versions(f, "a") == ("570.86.15", "12.8")
    assert versions(f, "b") == (OLD, "12.2")  # not its update
    # the state: 0600 in a 0700 directory under the simulator's state directory
    files = list(_state.rglob("*.json"))
    assert len(files) == 1
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("470.82.01", "11.4"),
        ("525.60.13", "12.0"),
        ("535.161.08", "12.2"),
        ("550.54.14", "12.4"),
        ("550.90.07", "12.4"),
        ("560.35.03", "12.6"),
        ("570.86.15", "12.8"),
        ("575.57.08", "12.9"),
        ("580.65.06", "13.0"),
        ("580.95.05", "13.0"),
        ("590.44.01", "13.1"),
    ],
)
def test_the_node_reports_the_cuda_of_its_new_driver(
    tmp_path: Path, driver: str, cuda: str
) -> None:
    f = fleet_file(tmp_path)
    assert sim_update(["--fleet", str(f), "--node", "b", "--driver", driver]) == 0
    assert versions(f, "b") == (driver, cuda)


def test_an_impossible_pair_is_refused_before_anything_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _state: Path
) -> None:
    f = fleet_file(tmp_path)
    before = digest(f)
    argv = ["--fleet", str(f), "--node", "a", "--driver", "550.90.07", "--cuda", "13.0"]
    assert sim_update(argv) == 2
    err = capsys.readouterr().err
    assert "--cuda 13.0" in err and "580.65.06" in err and "12.4" in err, err
    assert digest(f) == before and not list(_state.rglob("*.json"))
    assert versions(f, "a") == (OLD, "12.2")
    # R580 reports 13.0, never 12.4
    assert sim_update([*argv[:5], "580.65.06", "--cuda", "12.4"]) == 2
    assert "never 12.4" in capsys.readouterr().err
    # no CUDA 12.7 toolkit: the table names the releases it knows
    assert sim_update([*argv[:5], "565.57.01", "--cuda", "12.7"]) == 2
    assert "--cuda 12.7" in capsys.readouterr().err
    assert sim_update([*argv[:5], "banana"]) == 2
    assert "--driver 'banana'" in capsys.readouterr().err
    assert sim_update(["--fleet", str(f), "--node", "zz", "--driver", "550.90.07"]) == 2
    assert "--node zz" in capsys.readouterr().err
    # a pair the driver reports is accepted
    assert sim_update([*argv[:5], "550.90.07", "--cuda", "12.4"]) == 0
    assert versions(f, "a") == ("550.90.07", "12.4")


def test_a_count_entry_node_takes_its_update_and_its_fault_once(tmp_path: Path) -> None:
    f = fleet_file(tmp_path)
    assert sim_update(["--fleet", str(f), "--node", "grp-01", "--driver", "550.90.07"]) == 0
    spec = parse_fleet_spec(str(f))
    kinds = [(x.node, x.gpu, x.kind.value) for x in spec.faults]
    assert kinds == [("grp-01", 1, "fallen_off_bus")]  # update_gpu_lost consumed, GPU 1 lost
    drivers = {n.name: n.driver_version for n in spec.nodes}
    assert drivers["grp-01"] == "550.90.07" and drivers["grp-00"] == OLD
    # a second update: the lost GPU stays lost, no second fault from the consumed one
    assert sim_update(["--fleet", str(f), "--node", "grp-01", "--driver", "570.86.15"]) == 0
    again = parse_fleet_spec(str(f))
    assert [(x.node, x.kind.value) for x in again.faults] == [("grp-01", "fallen_off_bus")]
    assert versions(f, "grp-01")[1] == "12.8"


def test_an_edited_fleet_file_and_reset_forget_the_updates(tmp_path: Path) -> None:
    f = fleet_file(tmp_path)
    assert sim_update(["--fleet", str(f), "--node", "a", "--driver", "570.86.15"]) == 0
    assert sim_update(["--fleet", str(f), "--reset"]) == 0
    assert versions(f, "a") == (OLD, "12.2")
    assert sim_update(["--fleet", str(f), "--node", "a", "--driver", "570.86.15"]) == 0
    f.write_text(FLEET.replace("# my fleet", "# my edited fleet"), encoding="utf-8")
    assert versions(f, "a") == (OLD, "12.2")  # another fleet now: the old state is ignored


def test_a_driver_older_than_the_table_reports_cuda_unknown(tmp_path: Path) -> None:
    f = tmp_path / "old.yaml"
    f.write_text('nodes: [{name: o, model: h100-sxm, gpus: 1, driver_version: "418.87.01"}]\n')
    assert versions(f, "o") == ("418.87.01", None)  # R418 predates CUDA 11.0's row: unknown


@pytest.mark.parametrize(
    ("driver", "cuda", "words"),
    [
        ("550.90.07", "13.0", "needs driver >= 580.65.06"),
        ("580.65.06", "12.4", "never 12.4"),
        ("535.104.05", "12.4", "needs driver >= 550.54.14"),
    ],
)
def test_a_baseline_pair_no_driver_reports_is_refused(
    tmp_path: Path, driver: str, cuda: str, words: str
) -> None:
    p = tmp_path / "baseline.yaml"
    p.write_text(f'models:\n  h100-sxm:\n    driver: "{driver}"\n    cuda: "{cuda}"\n')
    with pytest.raises(ConfigError) as err:
        load_baseline(p)
    assert "models.h100-sxm.cuda" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize(
    ("driver", "cuda"), [("550.90.07", "12.4"), ("570.86.15", "12.8"), ("565.57.01", "12.7")]
)
def test_a_baseline_pair_a_driver_reports_loads(tmp_path: Path, driver: str, cuda: str) -> None:
    p = tmp_path / "baseline.yaml"
    p.write_text(f'models:\n  h100-sxm:\n    driver: "{driver}"\n    cuda: "{cuda}"\n')
    assert load_baseline(p).models["h100-sxm"].cuda == cuda  # 12.7: R565's, no toolkit row
