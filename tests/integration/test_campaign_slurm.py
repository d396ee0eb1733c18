"""Maintenance campaigns over the REAL local Slurm dev cluster (issue 15, scheduler backends):
a controller whose scheduler is `SlurmBackend`, and three simulated agent processes named like
the cluster's nodes whose update command is a real script (it changes the driver version in
the fleet file and restarts the agent).

1. A campaign over a node running a short Slurm job: Slurm shows the node draining with the
   campaign's reason (``scontrol show node``), the campaign waits for the job to end, the update
   runs once, and the node returns to service in Slurm (no DRAIN flag).
2. A campaign over a node whose job would run forever: at the drain deadline its batch shell
   (the job itself: ``exec``) gets SIGUSR1, writes its checkpoint, and after the grace Slurm
   requeues it (``restart_cnt`` 1); the node is updated and resumed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster
from gpufleet.testing.testbed import Controller, wait_for
from tests.integration import campaigns
from tests.integration.campaigns import SupervisedAgent
from tests.slurm.conftest import running_cluster

pytestmark = pytest.mark.process


NODES = ["gpu1", "gpu2", "gpu3"]
FOREVER = """#!/bin/sh
trap 'echo "checkpoint restart=$SLURM_RESTART_COUNT" >> "{ckpt}"; exit 0' USR1
echo "start restart=${{SLURM_RESTART_COUNT:-0}}" >> "{ckpt}"
while :; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[DevCluster]:
    with running_cluster() as dev:
        yield dev


def _show_node(b: SlurmBackend, node: str) -> str:
    return b.cmd.run([b.cmd.binaries.scontrol, "show", "node", node]).stdout


def _campaign(ctl: Controller, node: str, script: Path, **kw: Any) -> int:
    body = campaigns.body(str(script), select=[["node", node]], batch=1, floor=0.3, **kw)
    return int(campaigns.start(ctl, body)["id"])


def _ended(ctl: Controller, cid: int) -> dict[str, Any]:
    return campaigns.wait_ended(ctl, cid, 150, f"campaign {cid} ended")


def test_campaigns_drain_update_and_resume_slurm_nodes(cluster: DevCluster, tmp_path: Path) -> None:
    backend = SlurmBackend(
        slurm_conf=str(cluster.slurm_conf), output_dir=str(cluster.root / "jobs")
    )
    ctl = Controller(tmp_path / "data", scheduler=backend).start()
    script, log = campaigns.update_script(tmp_path)
    agents = [SupervisedAgent(n, ctl.url, ctl.token("agent", node=n), tmp_path / n) for n in NODES]
    jobs: list[str] = []
    try:
        wait_for(
            lambda: all(
                ctl.service is not None
                and (nc := ctl.service.store.nodes.get(n)) is not None
                and nc.state == "in_service"
                for n in NODES
            ),
            120,
            "three nodes in service",
        )
        # a short job on one node (1 of its 2 GPUs), a training job on another (both GPUs)
        ckpt = tmp_path / "ckpt.log"
        train = tmp_path / "train.sh"
        train.write_text(FOREVER.format(ckpt=ckpt), encoding="utf-8")
        train.chmod(0o755)
        jobs.append(backend.submit(JobSpec(name="short", command=("sleep", "15"), gpus=1)))
        job = wait_for(
            lambda: (j := backend.job(jobs[0])).state is JobState.RUNNING and j, 60, "job running"
        )
        node = job.nodes[0]
        jobs.append(backend.submit(JobSpec(name="train", command=(str(train),), gpus=2)))
        job = wait_for(
            lambda: (j := backend.job(jobs[1])).state is JobState.RUNNING and ckpt.exists() and j,
            60,
            "training running",
        )
        node2 = job.nodes[0]
        assert node2 != node

        # 1. the short job: the drain waits for it
        cid = _campaign(ctl, node, script, drain_deadline_s=None)
        shown = wait_for(
            lambda: "DRAIN" in (t := _show_node(backend, node)) and t, 30, "Slurm drains"
        )
        assert f"Reason=gpufleet: maintenance campaign {cid}" in shown, shown
        assert backend.job(jobs[0]).state is JobState.RUNNING  # not killed: it may finish
        doc = _ended(ctl, cid)
        assert doc["state"] == "done" and doc["nodes"][0]["step"] == "done", doc["nodes"]
        assert doc["requeued"]["nodes"] == 0  # it ended by itself
        assert backend.job(jobs[0]).state is JobState.SUCCEEDED
        assert log.read_text(encoding="utf-8").split()[0::2] == [node]
        after = wait_for(
            lambda: "DRAIN" not in (t := _show_node(backend, node)) and t, 30, "Slurm resumes"
        )
        assert "State=IDLE" in after, after

        # 2. the job that never ends: checkpoint signal at the deadline, then Slurm's requeue
        cid2 = _campaign(
            ctl,
            node2,
            script,
            drain_deadline_s=3,
            drain_timeout_s=120,
            checkpoint_grace_s=5,
        )
        doc = _ended(ctl, cid2)
        assert doc["state"] == "done", doc
        assert doc["requeued"] == {"signalled": 1, "killed": 0, "nodes": 1}, doc["requeued"]
        lines = ckpt.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "start restart=0" and "checkpoint restart=" in lines[1], lines
        requeued = wait_for(
            lambda: (j := backend.job(jobs[1])).restarts >= 1 and j, 60, "Slurm requeued it"
        )
        assert requeued.restarts == 1
        assert sorted(log.read_text(encoding="utf-8").split()[0::2]) == sorted({node, node2})
        wait_for(lambda: "DRAIN" not in _show_node(backend, node2), 30, "Slurm resumes node 2")
    finally:
        for a in agents:
            a.stop()
        ctl.stop()
        for jid in jobs:
            with contextlib.suppress(Exception):
                backend.cancel(jid)
        for n in NODES:
            with contextlib.suppress(Exception):
                backend.resume(n)
