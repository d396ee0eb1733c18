"""Issue 14, items 7 and 8, on a REAL Slurm dev cluster (munged, slurmctld, slurmd on loopback):

- node lines generated with this host's real CPU topology and memory register (slurmd accepts
  them: the nodes go idle, ``scontrol show node`` has the figures), GPU model and driver
  features work in ``sbatch --constraint``; a line claiming more memory than the host has is
  refused by Slurm (so the first check could fail);
- the generated HealthCheckProgram (run by slurmd itself, every 2 s) drains a node whose
  simulated GPU falls off the bus, with the finding as the reason, within the limit of nodes
  out (a second failing node is blocked), resumes it when healthy, and never resumes a node a
  person drained.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpufleet
from gpufleet.devices.host import read_host
from gpufleet.errors import GpufleetError
from gpufleet.schedulers.base import JobState, SchedNodeState
from gpufleet.schedulers.slurm import config_gen as cg
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster, temp_cluster
from gpufleet.schedulers.slurm.local_drain import HEALTH_PREFIX, drained_by_check
from gpufleet.testing.timescale import scaled
from tests.waiting import wait_truthy

from .conftest import require_slurm

pytestmark = pytest.mark.process


NODES = ("gpu1", "gpu2", "gpu3")


def _inventory(names: tuple[str, ...], memory_extra_mb: int = 0) -> dict[str, object]:
    """An inventory as `gpufleet inventory --json` writes it on a GPU node: simulated GPUs,
    this machine's real CPU topology and memory."""
    from gpufleet.cli.inventory import inventory_document
    from gpufleet.devices.discovery import collect, open_fleet

    fleet = open_fleet(sim=f"{len(names)}x2xh100", seed=7)
    try:
        nodes, notes = collect(fleet)
    finally:
        fleet.close()
    host = dataclasses.asdict(read_host())
    host["memory_mb"] += memory_extra_mb
    doc: dict[str, object] = json.loads(
        json.dumps(inventory_document(nodes, [], notes), default=str)
    )
    for n, name in zip(doc["nodes"], names, strict=True):  # type: ignore[call-overload]
        n["name"], n["host"] = name, host
    return doc


def _show(dev: DevCluster, node: str) -> dict[str, str]:
    out = dev.commands().run(["scontrol", "show", "node", node]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_real_topology_registers_and_features_constrain(tmp_path: Path) -> None:
    require_slurm()
    host = read_host()
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(_inventory(("n1", "n2"))))
    from typer.testing import CliRunner

    from gpufleet.cli.app import app

    res = CliRunner().invoke(app, ["config", "slurm", "--inventory-file", str(inv), "--json"])
    assert res.exit_code == 0, res.output
    line = next(
        ln for ln in json.loads(res.output)["files"]["slurm.conf"].splitlines() if "n[1-2]" in ln
    )
    assert f"CPUs={host.cpus} Boards=1 SocketsPerBoard={host.sockets_per_board}" in line
    assert f"RealMemory={host.memory_mb}" in line
    cluster = cg.from_inventory(json.loads(inv.read_text()))
    dev = temp_cluster(cluster=cluster)
    try:
        dev.up()  # waits until every node is idle: slurmd registered, slurmctld accepted it
        shown = _show(dev, "n1")
        assert shown["CPUTot"] == str(host.cpus)
        assert shown["Sockets"] == str(host.sockets_per_board)
        assert shown["CoresPerSocket"] == str(host.cores_per_socket)
        assert shown["ThreadsPerCore"] == str(host.threads_per_core)
        assert shown["RealMemory"] == str(host.memory_mb)
        driver = next(f for f in shown["AvailableFeatures"].split(",") if f.startswith("driver_"))
        assert shown["AvailableFeatures"].split(",")[0] == "h100" and "." in driver
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        res_job = dev.commands().run(
            [
                "sbatch",
                "--parsable",
                f"--output={dev.root}/jobs/slurm-%j.out",
                f"--constraint=h100&{driver}",
                "--wrap=sleep 30",
            ]
        )
        job = res_job.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 15
        while b.job(job).state is not JobState.RUNNING:
            assert time.monotonic() < deadline, "constrained job never ran"
            time.sleep(0.1)
        with pytest.raises(GpufleetError):  # no node has this driver: refused at submit
            dev.commands().run(
                [
                    "sbatch",
                    "--parsable",
                    "--output=/dev/null",
                    "--constraint=driver_1.2.3",
                    "--wrap=true",
                ]
            )
        b.cancel(job)
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


def test_a_line_claiming_more_memory_than_the_host_has_is_refused() -> None:
    """The counter-check: slurmd's registration is really compared with the line."""
    require_slurm()
    dev = temp_cluster(cluster=cg.from_inventory(_inventory(("big1",), memory_extra_mb=4096)))
    try:
        with pytest.raises(GpufleetError, match=r"(?i)low real_?memory"):
            dev.up(timeout_s=5)
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


# --- the health check, run by slurmd ------------------------------------------------------


def _fleet(path: Path, faulty: tuple[str, ...]) -> Path:
    lines = ["seed: 3", "nodes:"] + [f"  - {{name: {n}, model: h100-sxm, gpus: 2}}" for n in NODES]
    lines += ["faults:"] + [
        f"  - {{kind: fallen_off_bus, node: {n}, gpu: 1, at_s: 0}}" for n in faulty
    ]
    if not faulty:
        lines[-1] = "faults: []"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def checked(tmp_path: Path) -> Iterator[tuple[DevCluster, Path, Path]]:
    """A 3-node cluster whose HealthCheckProgram is the generated wrapper and command
    (``--max-drained 2``), every 2 s; ``select`` names the fleet file the checks read."""
    require_slurm()
    select = tmp_path / "fleet-in-use"
    select.write_text(str(_fleet(tmp_path / "healthy.yaml", ())), encoding="utf-8")
    root = tmp_path / "slurm"
    root.mkdir()
    hc, log = tmp_path / "hc.sh", tmp_path / "log" / "health-check.log"
    # The generated command, run through a stand-in `gpufleet` that adds what a node with
    # real GPUs would not need: the simulated fleet, and this node's name in it. One check per
    # node at a time (flock -n): a loaded machine does not pile them up.
    src = Path(gpufleet.__file__).resolve().parents[1]
    stand_in = tmp_path / "gpufleet"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'exec flock -n "{tmp_path}/hc-$SLURMD_NODENAME.lock" env PYTHONPATH={src} '
        f'{sys.executable} -m gpufleet "$@" --sim "$(cat {select})" --node "$SLURMD_NODENAME"\n'
    )
    stand_in.chmod(0o755)
    dev = DevCluster(root=root, nodes=3, health_check_program=str(hc), health_check_interval_s=2)
    command = cg.health_check_command(gpufleet=str(stand_in), max_drained="2", duration_s=0.3)
    hc.write_text(cg.health_check_wrapper(str(dev.slurm_conf), command, str(log)))
    hc.chmod(0o755)
    dev.up(timeout_s=30)
    try:
        yield dev, select, log
    finally:
        dev.down()
        for lock in tmp_path.glob("hc-*.lock"):  # a check still running holds its lock
            _stop_holders(lock)


def _stop_holders(lock: Path) -> None:
    """Stop health checks still running after slurmd stopped: the processes holding ``lock``
    open (found through /proc, so only this test's own checks)."""
    import os
    import signal

    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(lock) for fd in fd_dir.iterdir()):
                os.kill(int(fd_dir.parent.name), signal.SIGKILL)
        except OSError:
            continue


def _wait(cond: Callable[[], object], limit_s: float, what: str) -> object:
    return wait_truthy(cond, limit_s, what, step_s=0.2)


def _states(b: SlurmBackend) -> dict[str, SchedNodeState]:
    return {n.name: n for n in b.node_states()}


def test_health_check_drains_within_limit_resumes_and_spares_peoples_drains(
    checked: tuple[DevCluster, Path, Path], tmp_path: Path
) -> None:
    dev, select, log = checked
    b = SlurmBackend(slurm_conf=str(dev.slurm_conf))
    assert not any("drain" in s.state for s in _states(b).values())
    person = "disk swap, ticket 4711"
    dev.commands().run(["scontrol", "update", "NodeName=gpu3", "State=DRAIN", f"Reason={person}"])

    # gpu1 and gpu2 lose GPU 1; gpu3 is out already and --max-drained is 2: room for ONE drain
    select.write_text(str(_fleet(tmp_path / "faulty.yaml", ("gpu1", "gpu2"))), encoding="utf-8")
    t0 = time.monotonic()

    # Both checks run at once, so both may drain; the one ranked past the limit then resumes
    # itself (`LocalGuard.excess`). A node seen drained alone is therefore not yet the one that
    # stays: wait for the settled state, one drained and the other's check saying it is blocked
    # (a blocked drain or a back-off; this test once took the transient drain for the outcome).
    def settled() -> str | None:
        ours = [n for n, s in _states(b).items() if drained_by_check(s)]
        if len(ours) != 1:
            return None
        other = "gpu2" if ours[0] == "gpu1" else "gpu1"
        return ours[0] if "blocked by circuit breaker" in _log(log, other) else None

    node = str(_wait(settled, 30, "one failing node drained, the other blocked"))
    took = time.monotonic() - t0
    print(f"\nfault -> drained by HealthCheckProgram (interval 2 s): {took:.1f} s")
    st = _states(b)[node]
    assert "drain" in st.state and not st.schedulable
    assert st.reason.startswith(HEALTH_PREFIX + "GPU_LOST"), st.reason  # the finding's code
    # the other failing node stays blocked by the limit, for as long as we watch (3 intervals)
    end = time.monotonic() + 6
    while time.monotonic() < end:
        s = _states(b)
        assert sum("drain" in x.state for x in s.values()) <= 2, s
        assert s["gpu3"].reason == person
        time.sleep(0.3)

    # healthy again: the check resumes the node it drained, and only that one
    select.write_text(str(_fleet(tmp_path / "healthy2.yaml", ())), encoding="utf-8")
    # The check resumes the node, then writes its line: wait for both, the line names who did it
    # (a state seen between the two once failed this test).
    _wait(
        lambda: "drain" not in _states(b)[node].state and f"{node}: resumed" in _log(log, node),
        30,
        f"{node} resumed by the check",
    )
    time.sleep(5)  # two more intervals: the person's drain stays
    gpu3 = _states(b)["gpu3"]
    assert "drain" in gpu3.state and gpu3.reason == person
    assert all("drain" not in _states(b)[n].state for n in ("gpu1", "gpu2"))


def _log(log: Path, node: str) -> str:
    try:
        text = log.read_text(encoding="utf-8")
    except OSError:
        return ""
    return "\n".join(ln for ln in text.splitlines() if f" {node}: " in ln)


def test_undecided_drains_nothing_and_exits_3(
    slurm_cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing node whose controller cannot be asked, or whose Slurm cannot be read, is not
    drained; the check exits 3 and says why."""
    from typer.testing import CliRunner

    from gpufleet.cli.app import app

    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        "nodes:\n  - {name: gpu2, model: h100-sxm, gpus: 2}\n"
        "faults:\n  - {kind: ecc_dbe, node: gpu2, gpu: 0, at_s: 0}\n"
    )
    token = tmp_path / "token"
    token.write_text("not-a-real-token\n")
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    base = ["health", "--sim", str(fleet), "--node", "gpu2", "--exit-code", "--slurm-drain"]
    runner = CliRunner()
    unreachable = ["--controller", "http://127.0.0.1:9", "--token-file", str(token)]
    res = runner.invoke(app, [*base, *unreachable, "--json"])
    assert res.exit_code == 3, res.output
    action = json.loads(res.stdout)["slurm"]["actions"][0]
    assert action["action"] == "undecided" and "circuit breaker" in action["detail"]
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    res = runner.invoke(app, [*base, "--max-drained", "3"])
    assert res.exit_code == 3
    assert "cannot read Slurm's node states" in res.stderr
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    b = SlurmBackend(slurm_conf=str(slurm_cluster.slurm_conf))
    assert "drain" not in _states(b)["gpu2"].state


def test_hung_gpus_check_drains_within_its_time_budget(
    slurm_cluster: DevCluster, tmp_path: Path
) -> None:
    """Four GPUs whose NVML calls never return: the whole check, as slurmd would run it (a
    fresh process), drains the node with the timeout finding and ends within its budget. The
    budget is the default 10 s times the tests' time scale, three times over (a fresh
    interpreter's imports are most of it on a loaded 2-core machine); the 10 s figure itself
    is `benchmarks/health_hung.py`'s."""
    import os
    import subprocess

    fleet = tmp_path / "hung.yaml"
    fleet.write_text(
        "nodes:\n  - {name: gpu2, model: h100-sxm, gpus: 8}\nfaults:\n"
        + "".join(
            f"  - {{kind: hung_call, node: gpu2, gpu: {g}, at_s: 0, seconds: 600}}\n"
            for g in (1, 3, 5, 7)
        )
    )
    budget = scaled(30.0)
    env = dict(os.environ, SLURM_CONF=str(slurm_cluster.slurm_conf))
    env["PYTHONPATH"] = str(Path(gpufleet.__file__).resolve().parents[1])
    argv = [sys.executable, "-m", "gpufleet", "health", "--sim", str(fleet), "--node", "gpu2"]
    argv += ["--exit-code", "--slurm-drain", "--max-drained", "3", "--duration", "1"]
    argv += ["--time-budget", f"{budget:.1f}"]
    b = SlurmBackend(slurm_conf=str(slurm_cluster.slurm_conf))
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=budget * 2, check=False
        )
        took = time.monotonic() - t0
        print(f"\nhealth --slurm-drain with 4 hung GPUs: {took:.1f} s (budget {budget:.0f} s)")
        assert took < budget, p.stderr
        st = _states(b)["gpu2"]
        assert p.returncode == 2, p.stdout + p.stderr
        assert "drain" in st.state and st.reason.startswith(HEALTH_PREFIX + "GPU_NVML_TIMEOUT")
        assert "gpu2: drained: GPU_NVML_TIMEOUT" in p.stderr
    finally:
        b.resume("gpu2")
