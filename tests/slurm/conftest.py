"""A real Slurm dev cluster on loopback for the whole session (munged, slurmctld, 3 slurmd).

Without the Debian packages (slurmctld slurmd slurm-client munge) or root, the cluster tests
skip with the reason; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest

from gpufleet.schedulers.slurm.devcluster import DevCluster, missing_binaries, temp_cluster


def require_slurm() -> None:
    """Skip (or fail under CI) when the dev cluster cannot run here."""
    missing = missing_binaries()
    why = None
    if missing:
        why = (
            f"Slurm dev cluster needs {', '.join(missing)} (apt-get install slurmctld slurmd "
            "slurm-client munge)"
        )
    elif os.geteuid() != 0:
        why = "Slurm dev cluster runs as root (SlurmUser=root, mknod for fake GPUs)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def running_cluster() -> Iterator[DevCluster]:
    """A started 3-node dev cluster (2 H100 each), taken down and removed at the end; skips (or
    fails under CI) where it cannot run (`require_slurm`)."""
    require_slurm()
    cluster = temp_cluster(nodes=3, gpus_per_node=2, gpu_type="h100")
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    with running_cluster() as cluster:
        yield cluster
