"""The Slurm backend against a REAL Slurm cluster on loopback (munged, slurmctld, 3 slurmd)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.errors import UnknownNameError
from gpufleet.schedulers.base import JobSpec, JobState, JobStatus
from gpufleet.schedulers.slurm import config_gen as cg
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster, temp_cluster
from gpufleet.testing.timescale import scaled
from tests.scheduling.protocol import assert_protocol

from .conftest import require_slurm

pytestmark = pytest.mark.process


def _wait_job(b: SlurmBackend, job_id: str, state: JobState, limit_s: float = 20) -> JobStatus:
    deadline = time.monotonic() + limit_s
    while True:
        j = b.job(job_id)
        if j.state is state:
            return j
        assert time.monotonic() < deadline, f"job {job_id} still {j.state} ({j.reason})"
        time.sleep(0.05)


def _wait_schedulable(b: SlurmBackend, node: str, limit_s: float = 15) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        n = {x.name: x for x in b.node_states()}[node]
        if "drain" not in n.state and n.schedulable:
            return
        assert time.monotonic() < deadline, f"{node} still {n.state} after resume"
        time.sleep(0.1)


def test_submit_drain_requeue_resume_cancel(slurm_cluster: DevCluster) -> None:
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    job = b.submit(JobSpec(name="gpufleet-test", tenant="acme", gpus=1, duration_s=300))
    first = _wait_job(b, job, JobState.RUNNING)
    assert len(first.nodes) == 1 and first.spec.gpus == 1 and first.spec.tenant == "acme"
    assert len(first.gpus) == 1  # one GRES index bound on the node
    node = first.nodes[0]

    t0 = time.monotonic()
    b.drain(node, "test: XID 79")
    states = {n.name: n for n in b.node_states()}
    assert "drain" in states[node].state and not states[node].schedulable
    assert states[node].reason == "gpufleet: test: XID 79"
    b.requeue(job)
    moved = _wait_job(b, job, JobState.RUNNING, limit_s=20)
    took = time.monotonic() - t0
    print(f"\nSlurm failover (drain + requeue -> running elsewhere): {took:.2f} s")
    assert moved.nodes and moved.nodes[0] != node
    assert moved.restarts == 1
    assert took < scaled(10), "requeued job must run again at once, not after cred_expire (121 s)"

    b.resume(node)
    _wait_schedulable(b, node)

    b.cancel(job)
    assert _wait_job(b, job, JobState.CANCELLED, limit_s=10).state.final


def test_a_job_sees_its_own_env_not_the_controllers_secrets(
    slurm_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_TOKEN", "gf_must_not_leak")
    monkeypatch.setenv("PGPASSWORD", "pw_must_not_leak")
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    out = slurm_cluster.root / "job-env.txt"
    spec = JobSpec(name="env", gpus=1, command=("sh", "-c", f"env > {out}"), env={"MINE": "a,b"})
    _wait_job(b, b.submit(spec), JobState.SUCCEEDED, limit_s=scaled(30))
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert seen["MINE"] == "a,b" and seen["SLURM_JOB_NAME"] == "env"
    assert "PATH" in seen
    leaked = {k for k, v in seen.items() if "must_not_leak" in v}
    assert leaked == set(), leaked


def test_bad_node_name_is_clear(slurm_cluster: DevCluster) -> None:
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    with pytest.raises(UnknownNameError) as ei:
        b.drain("gpu9", "test")
    assert ei.value.name == "gpu9"
    assert "gpu1" in (ei.value.hint or "")  # did-you-mean from the cluster's real nodes
    with pytest.raises(UnknownNameError):
        b.requeue("999999")


def test_protocol_lifecycle_on_the_real_cluster(slurm_cluster: DevCluster) -> None:
    """The lifecycle calls the control plane makes: is_idle, a fail drain that requeues what
    ran on the node, resume; job logs from the output directory."""
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    assert_protocol(b, "slurm")
    job = b.submit(JobSpec(name="proto", command=("sh", "-c", "echo hello; sleep 300"), gpus=1))
    node = _wait_job(b, job, JobState.RUNNING).nodes[0]
    assert not b.is_idle(node)
    b.drain(node, "test: fail finding", fail=True)
    moved = _wait_job(b, job, JobState.RUNNING, limit_s=20)
    assert moved.nodes[0] != node and moved.restarts == 1
    assert b.is_idle(node)
    states = {n.name: n for n in b.node_states()}
    assert not states[node].schedulable and states[node].reason == "gpufleet: test: fail finding"
    deadline = time.monotonic() + 10
    while "hello" not in (b.logs(job) or ""):
        assert time.monotonic() < deadline, "job output never appeared"
        time.sleep(0.1)
    b.cancel(job)
    b.resume(node)
    b.resume(node)  # not drained any more: nothing to do, no error
    _wait_schedulable(b, node)


def test_sinfo_lists_typed_gpus(slurm_cluster: DevCluster) -> None:
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    nodes = {n.name: n for n in b.node_states()}
    assert sorted(nodes) == ["gpu1", "gpu2", "gpu3"]
    assert all(n.gpus_total == 2 for n in nodes.values())


def test_health_check_wrapper_runs_with_empty_env(
    slurm_cluster: DevCluster, tmp_path: Path
) -> None:
    # slurmd runs HealthCheckProgram with an almost empty environment: the wrapper must carry
    # SLURM_CONF itself. Stand-in command: `sinfo -h -o %D`, which fails without SLURM_CONF here.
    wrapper = tmp_path / "hc.sh"
    sinfo = shutil.which("sinfo")
    assert sinfo
    wrapper.write_text(
        cg.health_check_wrapper(str(slurm_cluster.slurm_conf), [sinfo, "-h", "-o", "%D"])
    )
    wrapper.chmod(0o755)
    p = subprocess.run(
        [str(wrapper)], env={}, capture_output=True, text=True, timeout=10, check=False
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "3"


def test_generated_config_starts_real_slurm(tmp_path: Path) -> None:
    """Files generated from a simulated inventory start real slurmctld + slurmd."""
    require_slurm()
    doc = _sim_inventory()
    cluster = cg.from_inventory(doc)
    dev = temp_cluster(cluster=cluster)
    try:
        dev.up()
        text = (dev.root / "etc" / "slurm.conf").read_text()
        assert "TopologyPlugin=topology/tree" in text
        assert (dev.root / "etc" / "topology.conf").read_text().splitlines()[
            1
        ] == "SwitchName=leaf1 Nodes=sim-[00-01]"
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        nodes = {n.name: n for n in b.node_states()}
        assert sorted(nodes) == ["sim-00", "sim-01"]
        assert all(n.gpus_total == 4 and n.schedulable for n in nodes.values())
        job = b.submit(JobSpec(name="typed", gpu_model="h100-sxm", gpus=4, duration_s=30))
        assert _wait_job(b, job, JobState.RUNNING).gpus == (0, 1, 2, 3)
        b.cancel(job)
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


def _sim_inventory() -> dict[str, object]:
    from gpufleet.cli.inventory import inventory_document
    from gpufleet.devices.discovery import collect, open_fleet

    fleet = open_fleet(sim="2x4xh100", seed=7)
    try:
        nodes, notes = collect(fleet)
    finally:
        fleet.close()
    doc: dict[str, object] = json.loads(
        json.dumps(inventory_document(nodes, [], notes), default=str)
    )
    return doc


def test_generated_config_from_plan_starts_real_slurm() -> None:
    require_slurm()
    plan = {
        "chosen": "h100-sxm",
        "candidates": [
            {
                "candidate": "h100-sxm",
                "servers": 2,
                "server": {"gpus": 8, "gpu_key": "h100-sxm"},
                "fabric": {"compute": {"levels": 2, "radix": 2}},  # 1 node a leaf: 2 leaves + spine
            }
        ],
    }
    dev = temp_cluster(cluster=cg.from_plan(plan))
    try:
        dev.up()
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        assert sorted(n.name for n in b.node_states()) == ["gpu001", "gpu002"]
        assert (
            "SwitchName=spine1 Switches=leaf[1-2]"
            in (dev.root / "etc" / "topology.conf").read_text()
        )
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


def test_bring_up_is_fast_and_teardown_complete() -> None:
    require_slurm()
    dev = temp_cluster(nodes=2)
    t0 = time.monotonic()
    try:
        dev.up()
        took = time.monotonic() - t0
        print(f"\nSlurm dev cluster bring-up: {took:.2f} s")
        assert took < scaled(5)
        assert all(dev.status().values()) and len(dev.status()) == 4
    finally:
        pids = dict(dev.pids)
        stopped = dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)
    assert sorted(stopped) == ["munged", "slurmctld", "slurmd-gpu1", "slurmd-gpu2"]
    for pid in pids.values():
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
        )
