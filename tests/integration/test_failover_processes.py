"""Failover with jobs as real processes, on the path `gpufleet up` runs (issue 12, item 3).

A real controller (embedded scheduler) and the real agents of three simulated nodes, run like
`gpufleet up` runs them (`FleetDriver`, `job_runners`, one exchange a second): jobs are real
processes under `LocalProcessExecutor`, a shell whose grandchild appends ``(generation, time)``
heartbeats to a file. XID 79 on the job's GPU: the node is drained for the fail finding, the
job's copy is killed by its (reachable) agent, and the job must run elsewhere well under 10 s
(the lease fallback alone would take 40 s), with the old copy's last heartbeat before the new
copy's first: confirmed dead before the new one started.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.testbed import Controller, UpAgents, wait_for
from tests.integration.conftest import embedded, fleet_of

pytestmark = pytest.mark.process


TARGET_S = 10.0  # issue 12: fault to running elsewhere, reachable agent, default settings
# what a failover that missed the fast path takes: the lease (30 s) + report staleness (10 s).
# The test tells the two paths apart at half of that; the figure against TARGET_S is
# benchmarks/failover.py's (a loaded machine slows the fast path, not the verdict)
FALLBACK_S = 40.0

# a shell whose grandchild writes heartbeats (PR_SET_PDEATHSIG alone would not stop it)
HEARTBEATS = (
    '( while :; do echo "$GPUFLEET_GENERATION $(date +%s.%N)" >> "$HB"; sleep 0.05; done ) & wait'
)


def heartbeats(path: Path) -> dict[int, list[float]]:
    """Heartbeat times per generation."""
    out: dict[int, list[float]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.setdefault(int(parts[0]), []).append(float(parts[1]))
    return out


class ProcessBed:
    """A controller and `gpufleet up`'s agents, with jobs as real processes."""

    def __init__(self, root: Path) -> None:
        self.ctl = Controller(root / "data", tick_s=1.0).start()  # the service's default tick
        fleet = fleet_of(["n1", "n2", "n3"])
        tokens = self.ctl.node_tokens(fleet)
        self.agents = UpAgents(self.ctl.url, "", fleet, root, tokens=tokens).start()

    def job(self, jid: str) -> dict[str, Any]:
        return dict(self.ctl.call("GET", f"/api/v1/jobs/{jid}").json())

    def stop(self) -> None:
        self.agents.stop()
        self.ctl.stop()


@pytest.fixture
def pbed(tmp_path: Path) -> Iterator[ProcessBed]:
    bed = ProcessBed(tmp_path)
    try:
        yield bed
    finally:
        bed.stop()


def test_xid79_reachable_agent_moves_a_process_job_fast_and_fenced(
    pbed: ProcessBed, tmp_path: Path
) -> None:
    wait_for(lambda: len(embedded(pbed.ctl).store.nodes()) == 3, 15, "agents report")
    hb = tmp_path / "hb"
    body = {
        "name": "hb",
        "command": ["sh", "-c", HEARTBEATS],
        "gpus": 1,
        "env": {"HB": str(hb)},
    }
    jid = pbed.ctl.call("POST", "/api/v1/jobs", json=body).json()["id"]
    first = wait_for(lambda: (j := pbed.job(jid))["state"] == "running" and j, 15, "running")
    wait_for(lambda: heartbeats(hb).get(1), 10, "first copy's heartbeats")
    node, gpu = first["nodes"][0], first["gpu_indexes"][0]
    t0 = time.time()
    pbed.agents.inject_xid79(node, gpu)
    moved = wait_for(
        lambda: (j := pbed.job(jid))["state"] == "running" and j["nodes"] != [node] and j,
        FALLBACK_S,
        "job running on another node",
    )
    took = time.time() - t0
    beats = wait_for(lambda: (b := heartbeats(hb)).get(2) and b, 5, "second copy's heartbeats")
    print(f"\nfault -> running elsewhere {took:.1f} s (target {TARGET_S:g} s)")
    assert took < FALLBACK_S / 2, f"fault -> running elsewhere took {took:.1f} s: the fallback?"
    # fenced: the old copy's last heartbeat came before the new copy's first one, and none after
    assert max(beats[1]) < min(beats[2]), "two generations were alive at once"
    time.sleep(0.5)
    assert max(heartbeats(hb)[1]) == max(beats[1]), "the old copy is still writing"
    assert (moved["requeues"], moved["restarts"]) == (1, 0)
    first_attempt = moved["attempts"][0]
    assert first_attempt["outcome"].startswith(f"requeued: node {node}")
