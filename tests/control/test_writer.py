"""The one writer: commands run on its thread, snapshots are immutable and published before an
answer, a failed command leaves the cache as the database has it, and a group of concurrent
batches becomes one commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpufleet.control.fleet import actions
from gpufleet.control.service import ControlService
from gpufleet.control.state.auth import Principal, Role
from gpufleet.control.state.lifecycle import Action
from tests.control.conftest import batch, push

OP = Principal(1, "alice", Role.OPERATOR)


def test_commands_run_on_the_writer_thread(make_service: Callable[..., ControlService]) -> None:
    svc = make_service()
    name = svc.store.writer.call(lambda: threading.current_thread().name)
    assert name == "gpufleet-writer"
    assert threading.current_thread().name != name


def test_snapshot_is_frozen_and_published_before_the_answer(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    before = svc.store.view
    node_before = before.nodes["n1"]
    out = actions.node_action(svc.store, "n1", Action.CORDON, OP, "maintenance")
    assert out.cordoned  # the answer is the published view after the write
    after = svc.store.view
    assert after.nodes["n1"].cordoned and after.generation > before.generation
    assert not node_before.cordoned and before.nodes["n1"] is node_before  # old one untouched
    with pytest.raises(TypeError):
        after.nodes["n2"] = node_before  # type: ignore[index]
    with pytest.raises(AttributeError):
        after.nodes["n1"].state = "failed"  # type: ignore[misc]


def test_failed_command_reloads_the_cache(make_service: Callable[..., ControlService]) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    store = svc.store

    def half_done() -> None:
        store.nodes["n1"].cordoned = True  # changed in the cache, then the write fails
        store.dirty("n1")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        store.writer.call(half_done)
    assert not store.nodes["n1"].cordoned  # rebuilt from the database
    assert not store.view.nodes["n1"].cordoned


def test_the_writer_outlives_a_failed_reload(
    make_service: Callable[..., ControlService], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = make_service()
    push(svc, batch("n1", 1))
    store = svc.store
    real_load = store.load

    def database_down() -> None:
        raise RuntimeError("database is down")

    monkeypatch.setattr(store, "load", database_down)  # the reload after the failure fails too

    def fails() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        store.writer.call(fails, timeout_s=10)
    monkeypatch.setattr(store, "load", real_load)
    assert store.writer.running  # the thread lives: later commands run on it, not inline
    assert store.writer.call(threading.get_ident, timeout_s=10) != threading.get_ident()
    push(svc, batch("n1", 2, devices=False))  # ingest still commits
    assert store.view.nodes["n1"].last_seen_s is not None


def test_concurrent_batches_share_group_commits(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service()
    push(svc, batch("warm", 1))
    groups = len(svc.store.writer.rate)
    gate, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        gate.wait(30)

    svc.store.writer.submit(hold)  # hold the writer so that batches queue up behind it
    assert held.wait(10)  # the writer runs `hold` now: nothing else it took with it is queued
    with ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(push, svc, batch(f"n{i}", 1)) for i in range(8)]
        # pending counts a batch just before it is queued: wait until all eight are queued
        deadline = time.monotonic() + 30
        while svc.ingest.pending < 8 or svc.store.writer._q.qsize() < 8:
            assert time.monotonic() < deadline, "the eight batches never queued up"
            threading.Event().wait(0.01)
        gate.set()
        acks = [f.result(30) for f in futs]
    assert [a.seq for a in acks] == [1] * 8 and not any(a.duplicate for a in acks)
    assert len(svc.store.writer.rate) - groups == 1  # eight batches, one transaction
    assert svc.store.writer.rate[-1][1] == 8
    assert set(svc.store.view.nodes) == {"warm", *(f"n{i}" for i in range(8))}


def test_run_awaits_a_command_from_the_event_loop(
    make_service: Callable[..., ControlService],
) -> None:
    import asyncio

    svc = make_service()

    async def on_loop() -> str:
        return await svc.store.writer.run(lambda: threading.current_thread().name)

    assert asyncio.run(on_loop()) == "gpufleet-writer"


def test_a_command_queued_behind_the_stop_fails_instead_of_hanging(
    make_service: Callable[..., ControlService],
) -> None:
    """A command that reaches the queue after the stop (the writer still ran when it was
    queued) fails with WriterStopped; its caller does not wait forever. Later calls run
    inline."""
    from gpufleet.control.state.writer import WriterStopped

    writer = make_service().store.writer
    busy, release = threading.Event(), threading.Event()

    def hold() -> bool:
        busy.set()
        return release.wait(10)

    first = writer.submit(hold)
    assert busy.wait(10)  # the writer is inside the first command
    stopper = threading.Thread(target=writer.stop)
    stopper.start()
    deadline = time.monotonic() + 10
    while writer._q.qsize() == 0 and time.monotonic() < deadline:  # the stop is queued
        time.sleep(0.01)
    late = writer.submit(lambda: "ran")  # the thread still runs: this is queued, after the stop
    release.set()
    stopper.join(10)
    assert first.result(5) is True
    with pytest.raises(WriterStopped):
        late.result(5)
    assert writer.call(lambda: "inline", timeout_s=5) == "inline"


def test_a_refused_transition_reloads_only_the_nodes_it_moved(
    make_service: Callable[..., ControlService],
) -> None:
    """A 409 (the state machine refuses) rebuilds no cache entry it did not touch: the other
    nodes keep their cache and snapshot objects; a node the command had already moved is
    reloaded as the database has it (the move was rolled back)."""
    from gpufleet.control.state.lifecycle import NodeState, TransitionError

    svc = make_service()
    for name in ("n1", "n2", "n3"):
        push(svc, batch(name, 1))
    store = svc.store
    cache_n2, view_n2 = store.nodes["n2"], store.view.nodes["n2"]
    state_n1 = store.nodes["n1"].state

    def move_then_refuse() -> None:
        with store.unit_of_work() as uow:
            uow.move(store.nodes["n3"], NodeState.DRAINING, actor="t", reason="t")
            assert store.nodes["n3"].state == NodeState.DRAINING  # moved in the cache
            uow.move(store.nodes["n1"], NodeState.REGISTERING, actor="t", reason="t")

    with pytest.raises(TransitionError):
        store.writer.call(move_then_refuse)
    assert store.nodes["n2"] is cache_n2 and store.view.nodes["n2"] is view_n2  # untouched
    rolled_back = NodeState.IN_SERVICE  # the move to draining was rolled back with the refusal
    assert store.nodes["n3"].state == store.view.nodes["n3"].state == rolled_back
    assert store.nodes["n1"].state == state_n1
    with pytest.raises(TransitionError):  # an operator's refused action: nothing reloaded
        actions.node_action(store, "n1", Action.VALIDATE, OP)
    assert store.nodes["n2"] is cache_n2


def test_leader_work_refused_before_it_began_reloads_nothing(
    make_service: Callable[..., ControlService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that knows it does not lead refuses leader work before the command runs: the
    cache is as the database has it, so there is nothing to rebuild. (Under load a lone
    controller whose lease had lapsed reloaded its whole cache on the writer at every refused
    pass, and the agents' pushes timed out behind the reloads.) Any other failure still
    reloads."""
    from gpufleet.control.ha.leader import Leadership, NotLeading

    svc = make_service()
    push(svc, batch("n1", 1))
    store = svc.store
    loads: list[object] = []
    real_load = store.load

    def counted_load(*a: Any) -> None:
        loads.append(a)
        real_load(*a)

    monkeypatch.setattr(store, "load", counted_load)
    follower = Leadership(svc.engine, holder="follower")  # never stepped: leads nothing
    ran: list[str] = []
    with pytest.raises(NotLeading):
        store.writer.call(follower.wrap(lambda: ran.append("leader work")))
    assert ran == [] and loads == []

    def fails() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        store.writer.call(fails)
    assert len(loads) == 1


def test_no_command_runs_on_a_cache_whose_rebuild_failed(
    make_service: Callable[..., ControlService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write fails half done and the rebuild after it fails too (the database away): the
    cache still holds the rolled-back change. Every later command, an agent's batch included,
    is refused with the database's error until a rebuild succeeds, and then runs on the rebuilt
    cache. (Before, the next commands ran on the cache with the change the database never got,
    and readers saw it as fact.)"""
    from sqlalchemy.exc import OperationalError

    svc = make_service()
    push(svc, batch("n1", 1))
    store = svc.store
    real_load = store.load
    away = OperationalError("SELECT", {}, Exception("server closed the connection"))

    def database_away(*_a: Any) -> None:
        raise away

    def half_done() -> None:
        store.nodes["n1"].cordoned = True  # in the cache only: the write then fails
        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(store, "load", database_away)
    with pytest.raises(OperationalError):
        store.writer.call(half_done)
    ran: list[bool] = []
    with pytest.raises(OperationalError):  # refused, not run on the doubtful cache
        store.writer.call(lambda: ran.append(store.nodes["n1"].cordoned))
    with pytest.raises(OperationalError):
        push(svc, batch("n1", 2, devices=False))
    assert ran == []
    monkeypatch.setattr(store, "load", real_load)  # the database is back
    assert store.writer.call(lambda: store.nodes["n1"].cordoned) is False
    assert push(svc, batch("n1", 2, devices=False)).duplicate is False
