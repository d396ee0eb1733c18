"""The health check's drain rules: the local limit (``--max-drained``) and who backs off when
checks drain at the same moment (pure rules, on node lists), and the controller's circuit
breaker asked for real (a real controller with simulated agents, a real Slurm dev cluster)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.client import Client
from gpufleet.errors import UsageError
from gpufleet.schedulers.base import SchedNodeState
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster
from gpufleet.schedulers.slurm.health_check import SlurmCheck
from gpufleet.schedulers.slurm.local_drain import (
    HEALTH_PREFIX,
    ControllerGuard,
    LocalGuard,
    parse_max_drained,
)
from gpufleet.testing.testbed import Agents, Controller, wait_for
from tests.integration.conftest import fleet_of


def _n(name: str, state: str = "idle", reason: str = "") -> SchedNodeState:
    out = "drain" in state or "down" in state
    return SchedNodeState(name=name, state=state, reason=reason, schedulable=not out)


def test_max_drained_counts_and_percentages() -> None:
    assert parse_max_drained("3")(100) == 3
    assert parse_max_drained("10%")(30) == 3  # floor(10 % of 30)
    assert parse_max_drained("10%")(9) == 1  # at least one
    assert parse_max_drained("0")(50) == 0  # the check never drains
    for bad in ("-1", "ten", "150%", "nan%"):
        with pytest.raises(UsageError, match="--max-drained"):
            parse_max_drained(bad)


def test_local_guard_counts_every_node_out_but_the_asking_one() -> None:
    g = LocalGuard("2")
    nodes = [_n("a"), _n("b", "idle+drain", "ops"), _n("c", "down", "not responding"), _n("d")]
    no = g.allows("a", nodes)
    assert not no.allowed and "2 of 4 Slurm nodes out, at most 2" in no.why and "b, c" in no.why
    assert g.allows("b", nodes).allowed  # b itself is not counted against b
    assert LocalGuard("3").allows("a", nodes).allowed


def test_simultaneous_drains_back_off_by_name_order() -> None:
    """Limit 2, one node drained by a person: of three nodes drained by checks at the same
    moment, the first by name keeps its drain, the two others resume themselves."""
    g = LocalGuard("2")
    ours = HEALTH_PREFIX + "GPU_LOST GPU 1 fell off the bus"
    nodes = [
        _n("n1", "idle+drain", "ops: disk swap"),
        _n("n3", "idle+drain", ours),
        _n("n2", "idle+drain", ours),
        _n("n4", "idle+drain", ours),
        _n("n5"),
    ]
    assert [n for n in ("n2", "n3", "n4") if g.excess(n, nodes)] == ["n3", "n4"]
    assert not g.excess("n1", nodes)  # a person's drain is never "excess"
    within = [nodes[0], nodes[2], nodes[4]]
    assert not g.excess("n2", within)


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[tuple[Controller, Client]]:
    """A real controller, three simulated agents named like the Slurm dev cluster's nodes."""
    ctl = Controller(tmp_path / "data").start()
    agents = Agents(ctl.url, ctl.token("agent"), fleet_of(["gpu1", "gpu2", "gpu3"]), run_jobs=False)
    agents.start()
    admin = Client(ctl.url, ctl.admin, timeout_s=10)
    try:
        wait_for(
            lambda: len(admin.nodes()) == 3 and all(n.state == "in_service" for n in admin.nodes()),
            20,
            "three nodes in service",
        )
        yield ctl, admin
    finally:
        admin.close()
        agents.stop()
        ctl.stop()


def _policy(admin: Client, **fields: object) -> None:
    body = {"max_out_fraction": 1.0, "min_out_nodes": 1, "dry_run": False, **fields}
    admin.request("PUT", "/policy", json=body)


@pytest.mark.process
def test_controller_guard_follows_the_real_breaker(ctl: tuple[Controller, Client]) -> None:
    c, admin = ctl
    check = SlurmCheck(controller=c.url, token=c.token("viewer"))
    guard, close = check.guard()
    try:
        assert isinstance(guard, ControllerGuard)
        ok = guard.allows("gpu2", [])
        assert ok.allowed and "circuit breaker closed" in ok.why
        admin.drain("gpu1", "maintenance")
        _policy(admin, max_out_fraction=0.0)  # at most max(1, 0) = 1 out: gpu1 is that one
        blocked = wait_for(
            lambda: (a := guard.allows("gpu2", [])) and not a.allowed and a, 10, "breaker open"
        )
        assert "circuit breaker" in blocked.why
        assert guard.allows("gpu1", []).allowed  # already out on the controller
        _policy(admin, dry_run=True)
        dry = guard.allows("gpu2", [])
        assert not dry.allowed and "dry run" in dry.why
    finally:
        close()


@pytest.mark.process
def test_health_asks_the_controller_before_draining_in_slurm(
    ctl: tuple[Controller, Client],
    slurm_cluster: DevCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c, admin = ctl
    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        "nodes:\n  - {name: gpu2, model: h100-sxm, gpus: 2}\n"
        "faults:\n  - {kind: ecc_dbe, node: gpu2, gpu: 1, at_s: 0}\n"
    )
    token = tmp_path / "token"
    token.write_text(c.token("viewer") + "\n")
    token.chmod(0o600)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    b = SlurmBackend(slurm_conf=str(slurm_cluster.slurm_conf))
    args = ["health", "--sim", str(fleet), "--node", "gpu2", "--exit-code", "--slurm-drain"]
    args += ["--controller", c.url, "--token-file", str(token), "--json"]
    try:
        admin.drain("gpu1", "maintenance")
        _policy(admin, max_out_fraction=0.0)
        wait_for(lambda: admin.summary().remediation.circuit_open, 10, "breaker open")
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output  # the verdict: fail
        action = json.loads(res.stdout)["slurm"]["actions"][0]
        assert action["action"] == "blocked" and "circuit breaker" in action["detail"]
        assert "drain" not in _state(b, "gpu2").state

        _policy(admin)  # 100 %: the breaker closes
        wait_for(lambda: not admin.summary().remediation.circuit_open, 10, "breaker closed")
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        assert json.loads(res.stdout)["slurm"]["actions"][0]["action"] == "drained"
        st = _state(b, "gpu2")
        assert "drain" in st.state and st.reason.startswith(HEALTH_PREFIX + "ECC_DBE_VOLATILE")
    finally:
        for node in ("gpu1", "gpu2", "gpu3"):  # the session cluster is shared: leave it clean
            b.resume(node)
        deadline = time.monotonic() + 10
        while any("drain" in n.state for n in b.node_states()) and time.monotonic() < deadline:
            time.sleep(0.1)


def _state(b: SlurmBackend, node: str) -> SchedNodeState:
    return next(n for n in b.node_states() if n.name == node)


def test_the_check_keeps_within_its_10_s_budget() -> None:
    """Calls to Slurm share what is left of 10 s (start-up included); with under a second
    left nothing is asked and nothing drained."""
    from gpufleet.health.tracker import HealthReport
    from gpufleet.health.types import Severity
    from gpufleet.schedulers.slurm import health_check

    now = [3.0]
    check = SlurmCheck(started_s=1.0, startup_s=1.5, clock=lambda: now[0])
    assert check.time_left() == pytest.approx(10 - 0.5 - 1.5 - 2.0)
    assert check.per_call_s() == pytest.approx(6.0 / 4)
    now[0] = 8.5  # 1.5 + 7.5 s gone: 0.5 s left
    assert check.per_call_s() == pytest.approx(0.5 / 4)
    report = HealthReport("gpu7", 0.0, Severity.FAIL, (), {})
    [outcome] = health_check.run([report], None, check)
    assert outcome.action == "undecided" and "no time left" in outcome.detail


def test_a_given_time_budget_replaces_the_10_s_one() -> None:
    """``--time-budget 30``: the same arithmetic over 30 s; below 1 s the option is refused."""
    from typer.testing import CliRunner

    from gpufleet.cli.app import app

    now = [3.0]
    check = SlurmCheck(started_s=1.0, startup_s=1.5, clock=lambda: now[0], budget_s=30.0)
    assert check.time_left() == pytest.approx(30 - 0.5 - 1.5 - 2.0)
    assert check.per_call_s() == 3.0  # a quarter of 26 s, capped at 3 s
    r = CliRunner().invoke(app, ["health", "--slurm-drain", "--time-budget", "0.5"])
    assert r.exit_code == 2 and "--time-budget" in r.output, r.output


def test_power_saving_is_not_out_but_down_and_maintenance_are() -> None:
    from gpufleet.schedulers.slurm.local_drain import is_out

    def n(state: str) -> SchedNodeState:
        return SchedNodeState(name="x", state=state, schedulable=False)

    assert [is_out(n(s)) for s in ("idle+powered_down", "idle+power_down", "future")] == [
        False,
        False,
        False,
    ]
    assert all(is_out(n(s)) for s in ("down+not_responding", "idle+drain", "idle+maint"))
