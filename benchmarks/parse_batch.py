"""Micro-benchmark: parse one agent batch (as the ingest benchmark sends it: 8 GPUs x SAMPLES
samples, from the simulator through the sim-fleet agents), microseconds per batch, best of
several rounds: ``parse_batch`` (the ingest path: the accept-only fast path of
`gpufleet.control.ingest.parse`, the model for anything it leaves, then the arrays for the
telemetry store) and ``Batch.model_validate_json`` alone, with and without the device records
(sent on an agent's first batch and when they change).

    python benchmarks/parse_batch.py [--samples 5] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.ingest


def best_us(fn: Callable[[], Any], repeat: int, rounds: int = 15) -> float:
    """Best of ``rounds`` runs of ``repeat`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / repeat * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    from benchmarks.ingest import render_pool

    from gpufleet.control.ingest.queue import parse_batch
    from gpufleet.wire import Batch

    body = render_pool(1, 8, args.samples)[0][2]
    for label, doc in (("with devices", body), ("without devices", {**body, "devices": None})):
        raw = json.dumps(doc).encode()
        ingest = best_us(partial(parse_batch, raw), args.repeat)
        model = best_us(partial(Batch.model_validate_json, raw), args.repeat)
        print(
            f"one batch {label} ({len(raw):,} bytes, 8 GPUs x {args.samples} samples): "
            f"parse_batch {ingest:.0f} us, of which model_validate_json {model:.0f} us"
        )


if __name__ == "__main__":
    main()
