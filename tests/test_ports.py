"""`gpufleet.testing.testbed.free_port`: ports from a block per xdist worker, below the
kernel's ephemeral range, never the same twice in a row, an occupied one skipped."""

from __future__ import annotations

import socket

import pytest

from gpufleet.testing import testbed


def test_each_worker_draws_from_its_own_block(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports = {testbed.free_port() for _ in range(20)}
        assert len(ports) == 20  # none handed out twice
        lo = testbed.PORT_BLOCKS_FROM + int(worker[2:]) * testbed.PORT_BLOCK_SIZE
        assert all(lo <= p < lo + testbed.PORT_BLOCK_SIZE for p in ports), (worker, ports)
        blocks.append(ports)
    assert not (blocks[0] & blocks[1] or blocks[1] & blocks[2])


def test_the_blocks_lie_below_the_kernels_ephemeral_range() -> None:
    top = testbed.PORT_BLOCKS_FROM + testbed.PORT_BLOCKS * testbed.PORT_BLOCK_SIZE
    assert top <= testbed._ephemeral_low()


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    lo = testbed.PORT_BLOCKS_FROM + 5 * testbed.PORT_BLOCK_SIZE
    monkeypatch.setitem(testbed._next_port, 5, 7)
    with socket.socket() as held:
        held.bind(("127.0.0.1", lo + 7))  # bound, as a daemon's would be
        assert testbed.free_port() == lo + 8


def test_too_low_an_ephemeral_range_falls_back_to_the_kernels_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(testbed, "_ephemeral_low", lambda: 1024)
    assert testbed.free_port() >= 1024
