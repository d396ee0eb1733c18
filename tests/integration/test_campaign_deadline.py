"""A campaign's drain deadline over real processes (issue 15): a controller (embedded
scheduler) and two simulated agents that run jobs as real processes. A job whose script traps
SIGUSR1 and writes a checkpoint runs on the first node the campaign takes; the drain never
ends by itself, so at the deadline the job gets SIGUSR1, writes its checkpoint, exits, and is
requeued (an infrastructure requeue: ``requeues`` grows, ``restarts`` does not) onto the other
node, where it starts again from its checkpoint. Every node is updated; the campaign counts
the job as requeued after the signal, none killed without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.testbed import wait_for
from tests.integration import campaigns
from tests.integration.campaigns import SupervisedAgent

pytestmark = pytest.mark.process


NODES = ["dl0", "dl1"]

JOB = """#!/bin/sh
# a training job: resumes from its checkpoint, saves one on SIGUSR1 (as with Slurm's --signal)
trap 'echo "checkpoint restart=$GPUFLEET_RESTART_COUNT" >> "$CKPT"; exit 0' USR1
echo "start restart=$GPUFLEET_RESTART_COUNT" >> "$CKPT"
while true; do sleep 0.1; done
"""


class JobAgent(SupervisedAgent):
    """An agent that runs the embedded scheduler's jobs as real processes."""

    extra_args = ("--run-jobs", "--executor", "process")


def test_drain_deadline_checkpoint_signals_and_requeues_a_job(tmp_path: Path) -> None:
    ctl, tokens = campaigns.controller(tmp_path, NODES)
    script, log = campaigns.update_script(tmp_path)
    job = tmp_path / "train.sh"
    job.write_text(JOB, encoding="utf-8")
    job.chmod(0o700)
    ckpt = tmp_path / "ckpt.log"
    agents = [JobAgent(n, ctl.url, tokens[n], tmp_path / n) for n in NODES]
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)
        r = ctl.call(
            "POST",
            "/api/v1/jobs",
            json={"name": "train", "command": [str(job)], "env": {"CKPT": str(ckpt)}},
        )
        assert r.status_code == 201, r.text
        jid = r.json()["id"]

        def job_doc() -> dict[str, Any]:
            doc: dict[str, Any] = ctl.call("GET", f"/api/v1/jobs/{jid}").json()
            return doc

        first = wait_for(
            lambda: (d := job_doc())["state"] == "running" and ckpt.exists() and d,
            60,
            "job running",
        )
        where = first["nodes"][0]
        body = campaigns.body(
            str(script),
            select=[["node", where]],
            batch=1,
            floor=0.4,
            drain_timeout_s=120,
            drain_deadline_s=2,
            checkpoint_signal="USR1",
            checkpoint_grace_s=20,
        )
        doc = campaigns.wait_ended(ctl, campaigns.start(ctl, body)["id"], 150)
        assert doc["state"] == "done", doc
        assert [n["step"] for n in doc["nodes"]] == ["done"], doc["nodes"]
        # the job's trap ran: it saved its checkpoint on the signal, in the grace period
        lines = ckpt.read_text(encoding="utf-8").splitlines()
        assert lines[0] == "start restart=0", lines
        assert any(x.startswith("checkpoint") and x.endswith("restart=0") for x in lines), lines
        assert doc["requeued"] == {"signalled": 1, "killed": 0, "nodes": 1}, doc["requeued"]
        # requeued onto the other node, resumed from the checkpoint (restart count 1)
        moved = wait_for(
            lambda: (d := job_doc())["state"] == "running" and d["nodes"][0] != where and d,
            60,
            "job running on the other node",
        )
        assert moved["requeues"] == 1 and moved["restarts"] == 0, moved
        wait_for(lambda: "start restart=1" in ckpt.read_text(encoding="utf-8"), 30, "job restarted")
        runs = log.read_text(encoding="utf-8").split()
        assert runs[0::2] == [where]  # the update ran once, after the job left
        ev = ctl.call("GET", "/api/v1/events", params={"kind": "maintenance_evacuated"})
        assert ev.status_code == 200, ev.text
        assert [e["node"] for e in ev.json()] == [where]
        assert "1 job(s) requeued after USR1, 0 killed without it" in ev.json()[0]["message"]
    finally:
        for a in agents:
            a.stop()
        ctl.stop()
