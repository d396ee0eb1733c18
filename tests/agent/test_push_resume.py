"""An agent whose control plane comes back is in contact again within its backoff cap, not a
push interval later (issue 12, item 2): while batches wait in the spool the agent replays them
as soon as the backoff allows, and the ``Ack`` of a replayed batch renews the job lease."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

import httpx

from gpufleet.agent.jobs import AgentJobs
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.schedulers.embedded import LocalProcessExecutor
from gpufleet.wire import Ack
from tests.agent.conftest import sim_node


class FlakyController:
    """Answers 503 while ``down``, else acknowledges every batch; records when it acked."""

    def __init__(self) -> None:
        self.down = True
        self.acked_at: list[float] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            return httpx.Response(503)
        doc = json.loads(gzip.decompress(request.content))
        self.acked_at.append(time.monotonic())
        ack = Ack(agent_id=doc["agent_id"], seq=doc["seq"])
        return httpx.Response(200, content=ack.model_dump_json().encode())


def test_contact_resumes_within_the_backoff_cap_and_renews_the_lease(tmp_path: Path) -> None:
    push_s = 2.0  # the backoff cap is min(5 s, heartbeat = push interval) = 2 s
    ctl = FlakyController()
    cfg = AgentConfig(
        fast_interval_s=0.5,
        push_interval_s=push_s,
        controller="http://controller.invalid",
        token="t",
        state_dir=tmp_path / "agent",
    )
    _fleet, node = sim_node("1x1xh100")
    agent = Agent(node.backend(), cfg, transport=httpx.MockTransport(ctl.handle))
    assert agent.pusher is not None
    agent.pusher.rng = lambda: 0.25  # backoffs of 0.125, 0.25, then 0.5 s (cap 2 s)
    executor = LocalProcessExecutor(root=tmp_path / "jobs", lease_s=30, fenced=True)
    jobs = AgentJobs("n1", executor, lease_s=30, on_contact=executor.renew_lease)
    agent.enable_jobs(jobs)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(2 * push_s + 0.3)  # failed pushes and replays: batches wait
        assert agent.pusher.stats.retryable_failures >= 2 and ctl.acked_at == []
        lease_before = executor.lease_file.stat().st_mtime
        failures = agent.pusher.stats.retryable_failures
        while agent.pusher.stats.retryable_failures == failures:
            time.sleep(0.005)
        back = time.monotonic()  # it returns right after a failed attempt
        ctl.down = False
        deadline = back + 3 * push_s
        while not ctl.acked_at and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ctl.acked_at, "no contact after the controller came back"
        resumed = ctl.acked_at[0] - back
        # the backoff (0.5 s) and scheduling slack; waiting for the next push would take up to
        # the 2 s push interval
        assert resumed < 1.0, f"contact resumed {resumed:.2f} s after the return"
        time.sleep(0.2)
        assert executor.lease_file.stat().st_mtime > lease_before, "the Ack renewed the lease"
    finally:
        stop.set()
        thread.join(timeout=15)
        agent.close()
