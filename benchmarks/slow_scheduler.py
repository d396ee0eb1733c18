"""Ingest and API read latency of a real controller while its scheduler takes 20 s to answer
``drain`` and ``is_idle``, against the same controller before any slow call (measured in the
same run): the rig and the traffic of `tests/control/test_slow_scheduler.py`.

docs/control-plane.md's figure: p99 under 200 ms while the slow calls are in flight. Prints
p99 per phase and its ratio to the baseline; asserts nothing about time.

    .venv/bin/python benchmarks/slow_scheduler.py [--delay 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=20.0, help="the scheduler's delay, seconds")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.control.test_slow_scheduler import measure, p99, slow_rig

    with tempfile.TemporaryDirectory() as d, slow_rig(Path(d), args.delay) as (client, tokens):
        phases = measure(client, tokens, args.delay)
    base_i, base_r = (p99(v) for v in phases["before"])
    for name, (ingest_ms, read_ms) in phases.items():
        pi, pr = p99(ingest_ms), p99(read_ms)
        print(
            f"{name:8s} ingest p99 {pi:6.1f} ms ({pi / base_i:4.2f}x), "
            f"read p99 {pr:6.1f} ms ({pr / base_r:4.2f}x), {len(ingest_ms)} requests"
        )


if __name__ == "__main__":
    main()
