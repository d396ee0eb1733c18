"""The built-in sweep workloads on real GPUs, as a command the sweep runs and reads:

    python -m gpufleet.energy.loadgen matmul-bf16|hbm [--seconds 30]

It loops bf16 matmuls (8192^3) or device-to-device copies (1 GiB, read plus write counted) on
every GPU ``CUDA_VISIBLE_DEVICES`` shows, and prints ``rate <total> <unit>`` about once a second
(TFLOP/s or GB/s, all GPUs together). Needs PyTorch (``pip install 'gpufleet[gpu]'``); changes
no GPU setting.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

MATMUL_N = 8192
COPY_BYTES = 2**30
RATE_REGEX = r"rate ([0-9.]+)"
UNITS = {"matmul-bf16": "TFLOP/s", "hbm": "GB/s"}


def _setup(torch: Any, workload: str, dev: int) -> tuple[Any, float]:
    """(one step as a function, work per step in the unit x seconds)."""
    d = f"cuda:{dev}"
    if workload == "matmul-bf16":
        a = torch.randn(MATMUL_N, MATMUL_N, device=d, dtype=torch.bfloat16)
        b = torch.randn(MATMUL_N, MATMUL_N, device=d, dtype=torch.bfloat16)
        return (lambda: torch.matmul(a, b)), 2.0 * MATMUL_N**3 / 1e12
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=d)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2.0 * COPY_BYTES / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.energy.loadgen")
    ap.add_argument("workload", choices=sorted(UNITS))
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed; pip install 'gpufleet[gpu]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("error: no CUDA GPU visible", file=sys.stderr)
        return 2
    steps = [_setup(torch, args.workload, d) for d in range(torch.cuda.device_count())]
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        t0, work = time.monotonic(), 0.0
        while time.monotonic() - t0 < 1.0:
            for fn, per in steps:
                fn()
                work += per
            torch.cuda.synchronize()
        print(f"rate {work / (time.monotonic() - t0):.3f} {UNITS[args.workload]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
