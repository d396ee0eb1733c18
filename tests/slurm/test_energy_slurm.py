"""Energy of a Slurm job (issue 16) on a REAL Slurm cluster on loopback: the controller runs
the Slurm backend, attributes the job by the GRES indexes Slurm bound (``IDX:`` of the job's
``gres_detail``, as ``scontrol show job -d`` prints them) and its start time, so the job is
charged its own GPU's power (known here: each GPU draws a different constant power) for the
time it ran, not the node's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.control.energy.query import report
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster
from tests.control.conftest import batch, push

pytestmark = pytest.mark.process


WATTS = (250.0, 650.0)


def test_a_slurm_job_is_charged_its_gres_gpu(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    b = SlurmBackend(
        slurm_conf=str(slurm_cluster.slurm_conf), output_dir=str(slurm_cluster.root / "jobs")
    )
    jid = b.submit(JobSpec(name="energy", tenant="acme", gpus=1, duration_s=300))
    deadline = time.monotonic() + 20
    while (j := b.job(jid)).state is not JobState.RUNNING:
        assert time.monotonic() < deadline, j
        time.sleep(0.05)
    try:
        assert j.started_at_s is not None and len(j.gpus) == 1
        node, gpu, start = j.nodes[0], j.gpus[0], j.started_at_s
        clock = ManualClock(start + 90)
        svc = ControlService(
            ServiceConfig(
                data_dir=tmp_path / "data",
                policy=RemediationPolicy(require_validation=False),
            ),
            clock=clock,
            scheduler=b,
        )
        svc.ingest.start()
        try:
            body = batch(node, 1, gpus=2, t=start - 30, k=120)  # 30 s before to 90 s after
            for g, s in enumerate(body["samples"]):
                s["fields"]["power_w"] = [WATTS[g]] * 120
            push(svc, body)
            svc.flush_rollups()
            who = Principal(None, "admin", Role.ADMIN)
            rep = report(svc.store, who, "job", 86400.0, clock(), b)
            row = next(r for r in rep["rows"] if r["key"] == jid)
            # the job ran from ``start`` to now (the clock: start + 90 s; samples to + 89 s)
            assert row["kwh"] == pytest.approx(WATTS[gpu] * 89 / 3.6e6, rel=0.02)
            assert row["tenant"] == "acme"
        finally:
            svc.ingest.stop()
            svc.engine.dispose()
    finally:
        b.cancel(jid)
