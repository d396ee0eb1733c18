"""nccl-tests style collective tables: time, algbw, busbw.

Bus bandwidth follows nccl-tests' ``doc/PERFORMANCE.md`` (github.com/NVIDIA/nccl-tests):
``algbw = size / time``; ``busbw = algbw x 2(n-1)/n`` for all_reduce, ``(n-1)/n`` for
all_gather, reduce_scatter and alltoall, ``1`` for broadcast. Sizes are per-rank buffer bytes as
nccl-tests prints them (``-b 8 -e 8G -f 2``).
"""

from __future__ import annotations

from gpufleet.catalog.performance import COLLECTIVES, bus_factor
from gpufleet.validate.results import CollectiveRow

MIN_SIZE = 8
MAX_SIZE = 8 * 2**30


def message_sizes(
    min_bytes: int = MIN_SIZE, max_bytes: int = MAX_SIZE, factor: int = 2
) -> list[int]:
    """8 B, 16 B, ... 8 GiB (nccl-tests ``-b 8 -e 8G -f 2``)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError("sizes need 1 <= min <= max and factor >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def row(op: str, size_bytes: int, seconds: float, n_ranks: int) -> CollectiveRow:
    """One table row from a measured time."""
    if seconds <= 0:
        raise ValueError("a collective cannot take zero time")
    algbw = size_bytes / seconds / 1e9
    return CollectiveRow(
        op=op,
        size_bytes=size_bytes,
        time_us=seconds * 1e6,
        algbw_gbps=algbw,
        busbw_gbps=algbw * bus_factor(op, n_ranks),
    )


def peak_busbw(rows: list[CollectiveRow], op: str) -> float:
    """The best bus bandwidth of one op (nccl-tests' large-message plateau)."""
    vals = [r.busbw_gbps for r in rows if r.op == op]
    return max(vals) if vals else 0.0


def format_table(rows: list[CollectiveRow]) -> str:
    """Plain text like nccl-tests' output."""
    lines = [f"{'op':<15}{'size(B)':>14}{'time(us)':>14}{'algbw(GB/s)':>14}{'busbw(GB/s)':>14}"]
    for r in rows:
        lines.append(
            f"{r.op:<15}{r.size_bytes:>14}{r.time_us:>14.1f}{r.algbw_gbps:>14.2f}"
            f"{r.busbw_gbps:>14.2f}"
        )
    return "\n".join(lines)


__all__ = ["COLLECTIVES", "format_table", "message_sizes", "peak_busbw", "row"]
