"""``--controller URL1,URL2``: agents and the CLI move to the replica that answers, stay there,
and never send a request that may have acted to a second replica."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.client import Client, ControllerUnreachable
from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.errors import UsageError
from gpufleet.replicas import controller_urls
from gpufleet.testing.testbed import Controller, free_port


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.mark.process
def test_agent_pushes_fail_over_to_the_replica_that_answers(tmp_path: Path) -> None:
    ctl = Controller(tmp_path / "data").start()
    backend = SimFleet(parse_fleet_spec("1x2xh100-sxm")).backends()[0]
    token = ctl.token("agent", node=backend.node_name)
    cfg = AgentConfig(
        controller=f"{dead_url()},{ctl.url}", token=token, state_dir=tmp_path / "agent"
    )
    agent = Agent(backend, cfg)
    try:
        agent.tick()
        agent.push_once()
        assert agent.pusher is not None
        assert agent.pusher.stats.acked == 1 and len(agent.pusher.spool) == 0
        assert agent.pusher.base_url == ctl.url and agent.pusher.replicas.failovers == 1
        agent.tick()
        agent.push_once()  # stays on the replica that answered: no new failover
        assert agent.pusher.stats.acked == 2 and agent.pusher.replicas.failovers == 1
        nodes = ctl.call("GET", "/api/v1/nodes").json()["nodes"]
        assert [n["name"] for n in nodes] == [backend.node_name]
        # the validation gate posts to the same replica
        assert agent.gate is not None and agent.gate.url.startswith(ctl.url)
    finally:
        agent.close()
        ctl.stop()


@pytest.mark.process
def test_cli_client_reads_from_the_next_replica(tmp_path: Path) -> None:
    ctl = Controller(tmp_path / "data").start()
    try:
        with Client(f"{dead_url()},{ctl.url}", ctl.admin, timeout_s=5) as c:
            assert c.summary().nodes == 0
            assert c.url == ctl.url
        with (
            Client(f"{dead_url()},{dead_url()}", ctl.admin, timeout_s=5) as c,
            pytest.raises(ControllerUnreachable),
        ):
            c.summary()
    finally:
        ctl.stop()


@pytest.mark.process
def test_a_post_that_may_have_acted_is_never_sent_twice(tmp_path: Path) -> None:
    """Replica A accepts the connection and never answers (a read timeout: it may have acted):
    the job must not be submitted to replica B as well."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = silent.accept()
                held.append(conn)
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    ctl = Controller(tmp_path / "data").start()
    a = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        with (
            Client(f"{a},{ctl.url}", ctl.admin, timeout_s=1) as c,
            pytest.raises(ControllerUnreachable),
        ):
            c.submit("once", ["sleep", "1"])
        assert ctl.call("GET", "/api/v1/jobs").json()["jobs"] == []
    finally:
        stop.set()
        for conn in held:
            conn.close()
        silent.close()
        ctl.stop()


@pytest.mark.parametrize(
    ("value", "needle"),
    [("", "expected a URL"), ("http://a:1,ftp://b", "'ftp://b'"), ("http://a,http://a", "twice")],
)
def test_bad_replica_lists_name_the_problem(value: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        controller_urls(value)
