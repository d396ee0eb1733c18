"""Failover through the controller on the embedded backend (XID 79 -> running elsewhere in
under 10 s), and a controller restart mid-stream of jobs that loses and duplicates nothing."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.integration.conftest import embedded

pytestmark = pytest.mark.process


Bed = Callable[..., tuple[Controller, Agents]]
TARGET_S = 10.0  # issue 7: under 10 s from the fault to the job running on another node
# a failover that missed the fast path waits out the agents' lease (30 s) and report staleness
# (10 s): the test tells the paths apart at half that; the figure is benchmarks/failover.py's
FALLBACK_S = 40.0


def _job(ctl: Controller, jid: str) -> dict[str, Any]:
    return dict(ctl.call("GET", f"/api/v1/jobs/{jid}").json())


def _copy(agents: Agents, jid: str) -> tuple[str, int, str] | None:
    return next((c for c in agents.running_copies() if c[0] == jid), None)


def _reporting(bed: Bed) -> tuple[Controller, Agents]:
    """A started controller and its three agents, once every agent has reported."""
    ctl, agents = bed()
    wait_for(lambda: len(embedded(ctl).store.nodes()) == 3, 10, "agents report")
    return ctl, agents


def _checkpointed_job(
    ctl: Controller, agents: Agents, checkpoint_dir: str
) -> tuple[str, tuple[str, int, str]]:
    """A 600 s one-GPU job with 2 restarts and ``checkpoint_dir``, once an agent runs it: its
    id and that first copy (job, generation, node)."""
    body = {
        "name": "ckpt",
        "command": ["sim"],
        "gpus": 1,
        "max_restarts": 2,
        "checkpoint_dir": checkpoint_dir,
        "duration_s": 600,
    }
    jid: str = ctl.call("POST", "/api/v1/jobs", json=body).json()["id"]
    first: tuple[str, int, str] = wait_for(
        lambda: _copy(agents, jid), 10, "job running on an agent"
    )
    return jid, first


def _no_overlap(agents: Agents) -> None:
    """No job ever ran twice at once (intervals of its copies, closed and open, are disjoint)."""
    now = agents.fleet.clock()
    spans: dict[str, list[tuple[float, float]]] = {}
    for i in agents.executor.intervals:
        spans.setdefault(i.job_id, []).append((i.start_s, i.end_s))
    for (jid, _gen, _node), c in agents.executor.copies.items():
        if c.stopped_s is None:
            spans.setdefault(jid, []).append((c.start_s, now))
    for jid, ss in spans.items():
        ss.sort()
        for (_a0, a1), (b0, _b1) in itertools.pairwise(ss):
            assert b0 >= a1 - 1e-9, f"job {jid} ran twice at once: {ss}"


def test_xid79_moves_the_job_to_another_node_fast(bed: Bed) -> None:
    ctl, agents = _reporting(bed)
    jid, first = _checkpointed_job(ctl, agents, "/ckpt/a")
    node = first[2]
    gpu = agents.executor.copies[first].launch.gpus[0]
    t0 = time.monotonic()
    agents.inject_xid79(node, gpu)
    second = wait_for(
        lambda: (c := _copy(agents, jid)) is not None and c[2] != node and c,
        FALLBACK_S,
        "job running on another node",
    )
    took = time.monotonic() - t0
    print(f"\nfault -> running elsewhere {took:.1f} s (target {TARGET_S:g} s)")
    assert took < FALLBACK_S / 2, f"{took:.1f} s: through the lease fallback?"
    launch = agents.executor.copies[second].launch
    assert launch.env["GPUFLEET_RESTART_COUNT"] == "1"
    assert launch.env["GPUFLEET_CHECKPOINT_DIR"] == "/ckpt/a"
    assert second[1] > first[1]  # a new generation (fence token)
    j = wait_for(
        lambda: (d := _job(ctl, jid))["state"] == "running" and d["nodes"] != [node] and d,
        5,
        "API shows it running elsewhere",
    )
    assert (j["requeues"], j["restarts"]) == (1, 0)
    # The lifecycle drained the faulty node for the fail finding.
    assert ctl.service is not None
    wait_for(
        lambda: ctl.service.store.nodes[node].state in ("draining", "drained"),  # type: ignore[union-attr]
        5,
        "faulty node drained",
    )
    _no_overlap(agents)


def test_controller_restart_mid_stream_loses_and_duplicates_nothing(bed: Bed) -> None:
    ctl, agents = _reporting(bed)
    ids = []
    for i in range(12):
        body = {"name": f"s{i}", "command": ["sim"], "gpus": 1, "duration_s": 0.6 + 0.1 * (i % 4)}
        ids.append(ctl.call("POST", "/api/v1/jobs", json=body).json()["id"])
    wait_for(lambda: len(agents.running_copies()) >= 2, 10, "jobs running")
    ctl.stop()  # mid-stream: copies run on, agents keep pushing into a closed port
    time.sleep(1.0)
    ctl.start()
    for i in range(12, 16):
        body = {"name": f"s{i}", "command": ["sim"], "gpus": 1, "duration_s": 0.5}
        ids.append(ctl.call("POST", "/api/v1/jobs", json=body).json()["id"])
    final = wait_for(
        lambda: all(_job(ctl, j)["state"] in ("succeeded", "failed", "cancelled") for j in ids),
        40,
        "every job ends",
    )
    assert final
    states = {j: _job(ctl, j)["state"] for j in ids}
    assert set(states.values()) == {"succeeded"}, [
        _job(ctl, j) for j in ids if states[j] != "succeeded"
    ]
    listed = [j["id"] for j in ctl.call("GET", "/api/v1/jobs").json()["jobs"]]
    assert sorted(listed, key=int) == sorted(ids, key=int)  # none lost, none invented
    completed: dict[str, int] = {}
    for iv in agents.executor.intervals:
        if iv.how == "completed":
            completed[iv.job_id] = completed.get(iv.job_id, 0) + 1
    assert completed == {j: 1 for j in ids}  # each job's work ran to the end exactly once
    _no_overlap(agents)


def test_copy_gone_while_controller_down_counts_a_restart(bed: Bed) -> None:
    """A job an agent confirmed running loses its copy while the controller is down (its node
    reboots: the agent comes back knowing no copies). After the restart it is a restart: the
    next copy sees GPUFLEET_RESTART_COUNT=1 (resume from the checkpoint), not 0."""
    ctl, agents = _reporting(bed)
    jid, first = _checkpointed_job(ctl, agents, "/ckpt/b")
    # "running" in the store only once an agent's report showed the copy
    wait_for(lambda: _job(ctl, jid)["state"] == "running", 5, "agent confirmed the copy")
    assert agents.executor.copies[first].launch.env["GPUFLEET_RESTART_COUNT"] == "0"
    ctl.stop()
    node = first[2]
    agents.executor.crash(node)  # the machine dies with the copy ...
    agents.executor.restore(node)  # ... and boots again: its agent knows no copies
    assert _copy(agents, jid) is None
    ctl.start()
    second = wait_for(
        lambda: (c := _copy(agents, jid)) is not None and c[1] > first[1] and c,
        15,
        "job running again after the controller restart",
    )
    assert agents.executor.copies[second].launch.env["GPUFLEET_RESTART_COUNT"] == "1"
    assert agents.executor.copies[second].launch.env["GPUFLEET_CHECKPOINT_DIR"] == "/ckpt/b"
    j = _job(ctl, jid)
    # the node lost it: an infrastructure requeue, not one of the job's own restarts
    assert (j["requeues"], j["restarts"]) == (1, 0)
    ended = [a for a in j["attempts"] if a["generation"] == first[1]]
    # whichever notices first words it: the restart's recovery ("gone while the controller was
    # down") or the next settle ("vanished"); either way one infrastructure requeue
    assert len(ended) == 1
    assert ended[0]["outcome"] in (
        f"requeued: copy on {node} gone while the controller was down",
        f"requeued: copy on {node} vanished",
    ), ended[0]["outcome"]
    _no_overlap(agents)
