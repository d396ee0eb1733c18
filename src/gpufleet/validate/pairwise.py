"""Pairwise node-to-node tests: which pairs run when, the bandwidth matrix, the expected figure.

Schedule: the round-robin ("circle") tournament: with N nodes (one bye added when N is odd),
N-1 rounds (N rounds when odd) in which every node meets at most one peer, so every unordered
pair is measured exactly once and the pairs of one round can run at the same time.

Each pair moves data both ways (a->b, then b->a); every local rank i of the sending node sends to
local rank i of the receiving node, so a node with 8 GPUs and 8 rails loads all its NICs. A
direction's bandwidth is the bytes of all its ranks over the slowest rank's time; the matrix
holds the slower direction (a link is as good as its worse half).

Second look: a link measured below ``RECHECK_FRACTION`` of the peers' reference in the first pass
is measured once more, and the better of its two passes counts. A link that is really slow is
slow both times; one that lost the CPU or the fabric to something else for a moment is not (on a
loaded 2-core machine a single starved pass made a healthy node look like the bad one beside a
slow link, 2026-12-06).

Test hook (off by default): ``GPUFLEET_TEST_SLOW_SEND="NODE:GBPS"`` (or ``"NODE>PEER:GBPS"``)
makes NODE's timed pairwise sends (to PEER only, if given) sleep ``bytes / GBPS`` after each
send, so a slow NIC or link can be rehearsed on loopback. Never set it in production.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpufleet.catalog import GpuModel
from gpufleet.errors import UsageError
from gpufleet.validate import thresholds as th

SLOW_SEND_ENV = "GPUFLEET_TEST_SLOW_SEND"


def round_robin(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint pairs covering every unordered pair of ``nodes`` exactly once."""
    ring: list[str | None] = list(nodes)
    if len(ring) % 2:
        ring.append(None)  # the bye
    n = len(ring)
    rounds: list[list[tuple[str, str]]] = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b) if nodes.index(a) < nodes.index(b) else (b, a))
        rounds.append(pairs)
        ring = [ring[0], ring[-1], *ring[1:-1]]  # keep the first, rotate the rest
    return rounds


@dataclass(frozen=True)
class SlowSend:
    """The parsed test hook: NODE's sends (to PEER, if set) are capped near GBPS."""

    node: str
    peer: str | None
    gbps: float

    def applies(self, sender: str, receiver: str) -> bool:
        return sender == self.node and (self.peer is None or receiver == self.peer)

    def delay_s(self, nbytes: int) -> float:
        return nbytes / (self.gbps * 1e9)


def parse_slow_send(text: str | None) -> SlowSend | None:
    """``"n2:0.05"`` or ``"n2>n3:0.05"``; None or empty: the hook is off."""
    if not text:
        return None
    where, sep, rate = text.rpartition(":")
    node, _, peer = where.partition(">")
    try:
        gbps = float(rate)
    except ValueError:
        gbps = 0.0
    if not sep or not node or gbps <= 0:
        raise UsageError(f"{SLOW_SEND_ENV}={text!r}: expected NODE:GBPS or NODE>PEER:GBPS")
    return SlowSend(node, peer or None, gbps)


@dataclass(frozen=True)
class PairSample:
    """One rank's timed transfer: ``sender`` node -> ``receiver`` node."""

    sender: str
    receiver: str
    local_rank: int
    nbytes: int  # all iterations together
    seconds: float


def direction_gbps(samples: list[PairSample]) -> dict[tuple[str, str], float]:
    """GB/s per (sender, receiver): all ranks' bytes over the slowest rank's time."""
    groups: dict[tuple[str, str], list[PairSample]] = {}
    for s in samples:
        groups.setdefault((s.sender, s.receiver), []).append(s)
    out = {}
    for key, ss in groups.items():
        secs = max(s.seconds for s in ss)
        if secs <= 0:
            raise ValueError(f"pair {key}: a transfer cannot take zero time")
        out[key] = sum(s.nbytes for s in ss) / secs / 1e9
    return out


def build_matrix(nodes: list[str], samples: list[PairSample]) -> dict[str, dict[str, float]]:
    """Symmetric matrix {a: {b: GB/s}}: the slower of the two directions of each pair."""
    bw = direction_gbps(samples)
    matrix: dict[str, dict[str, float]] = {n: {} for n in nodes}
    for a in nodes:
        for b in nodes:
            if (a, b) in bw or (b, a) in bw:
                ab, ba = bw.get((a, b)), bw.get((b, a))
                matrix[a][b] = min(v for v in (ab, ba) if v is not None)
    return matrix


# Links below this share of the peers' reference are measured a second time: under the strictest
# line in use (the catalog's 0.9) with room for the first pass's noise (a choice).
RECHECK_FRACTION = 0.75


def links_to_recheck(nodes: list[str], samples: list[PairSample]) -> list[tuple[str, str]]:
    """Unordered pairs (in ``nodes`` order) whose first-pass link is below ``RECHECK_FRACTION``
    of the peers' reference; every rank computes the same list from the gathered samples."""
    matrix = build_matrix(nodes, samples)
    line = peer_reference_gbps(matrix) * RECHECK_FRACTION
    return [
        (a, b)
        for i, a in enumerate(nodes)
        for b in nodes[i + 1 :]
        if b in matrix[a] and matrix[a][b] < line
    ]


def better_pass(
    nodes: list[str], first: list[PairSample], second: list[PairSample]
) -> list[PairSample]:
    """The samples with each re-measured pair's better pass: the one whose slower direction is
    faster. Pairs measured once keep their only pass."""
    m1, m2 = build_matrix(nodes, first), build_matrix(nodes, second)

    def pair(s: PairSample) -> tuple[str, str]:
        return (s.sender, s.receiver) if s.sender < s.receiver else (s.receiver, s.sender)

    better = {pair(s) for s in second if m2[s.sender][s.receiver] > m1[s.sender].get(s.receiver, 0)}
    return [s for s in first if pair(s) not in better] + [s for s in second if pair(s) in better]


def peer_reference_gbps(matrix: dict[str, dict[str, float]]) -> float:
    """Without a catalog figure: the median of each node's median link. One bad node (all its
    links slow) or one bad link moves it little, even with 3 nodes."""
    medians = [statistics.median(v.values()) for v in matrix.values() if v]
    return statistics.median(medians) if medians else 0.0


# Without a catalog figure only gross outliers count: a node or link below half of its peers'
# reference fails (an assumption for unknown hardware and loopback rehearsals, not a measurement).
PEER_LIMITS = th.TestLimits(pass_fraction=0.5, warn_fraction=0.6)


def expected_pair_gbps(model: GpuModel, ranks_per_node: int) -> float:
    """Node-to-node GB/s with ``ranks_per_node`` GPUs each on its own rail: the NICs in use
    (min(ranks, NICs) of the system's compute NICs) x line rate x the catalog's network
    efficiency."""
    return th.node_network_gbps(model, ranks_per_node)


def expected_multinode_busbw(model: GpuModel, ranks_per_node: int, nodes: int) -> dict[str, float]:
    """Bus bandwidth of every collective across ``nodes`` nodes (the catalog's fabric model,
    `gpufleet.catalog.performance.expected_busbw`; the simulator engine uses the same)."""
    return th.expected_busbw_by_op(model, nodes, ranks_per_node)
