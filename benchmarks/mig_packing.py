"""MIG packing: the exact planner against first-fit on random demand mixes, and plan time for
a 1,000-GPU fleet. Prints figures; asserts nothing about time.

    python benchmarks/mig_packing.py [--mixes 1000] [--seed 7]

Each mix: 8 GPUs of one model, 2-5 tenants, each asking 1-6 instances of a random profile
(media-extension profiles left out), so some mixes overflow the 8 GPUs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rich.progress import track

from gpufleet.mig.demand import Demand, DemandItem
from gpufleet.mig.fleet import parse_gpus
from gpufleet.mig.layouts import geometry_for
from gpufleet.mig.planner import plan_exact, plan_first_fit


def _mix(rng: random.Random, profiles: list[str], scale: int) -> Demand:
    items = [
        DemandItem(f"t{t}", rng.choice(profiles), rng.randint(1, 6) * scale)
        for t in range(rng.randint(2, 5))
    ]
    return Demand(tuple(items))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mixes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    for model in ("h100", "h200"):
        rng = random.Random(args.seed)
        profiles = [p.name for p in geometry_for(model).profiles if not p.media_extensions]
        gpus = parse_gpus(f"8x{model}")
        placed_ratio, used_ratio, fewer_gpus, more_placed = [], [], 0, 0
        for _ in track(range(args.mixes), description=f"{model} mixes"):
            demand = _mix(rng, profiles, 1)
            ex, ff = plan_exact(gpus, demand), plan_first_fit(gpus, demand)
            placed_ratio.append(ex.placed_compute_slices / max(ff.placed_compute_slices, 1))
            if ex.placed_compute_slices == ff.placed_compute_slices and ff.gpus_used:
                used_ratio.append(ex.gpus_used / ff.gpus_used)
                fewer_gpus += ex.gpus_used < ff.gpus_used
            more_placed += ex.placed_compute_slices > ff.placed_compute_slices
        print(
            f"{model}: {args.mixes} mixes on 8 GPUs: placed compute slices exact/first-fit "
            f"mean {statistics.mean(placed_ratio):.3f} (exact places more in {more_placed}); "
            f"where both place the same, GPUs used exact/first-fit mean "
            f"{statistics.mean(used_ratio):.3f} (fewer in {fewer_gpus} of {len(used_ratio)})"
        )
        big = parse_gpus(f"125x8x{model}")
        times_ex, times_ff = [], []
        for _ in range(5):
            demand = _mix(rng, profiles, 120)
            t0 = time.perf_counter()
            plan_exact(big, demand)
            times_ex.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            plan_first_fit(big, demand)
            times_ff.append(time.perf_counter() - t0)
        print(
            f"{model}: 1,000-GPU fleet: exact plan median "
            f"{statistics.median(times_ex) * 1e3:.0f} ms, "
            f"first-fit median {statistics.median(times_ff) * 1e3:.0f} ms (5 mixes)"
        )


if __name__ == "__main__":
    main()
