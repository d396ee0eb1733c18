"""Campaign plan for 1,000 nodes: expected duration against the ideal and against one node at
a time, and the lowest in-service capacity (issue 15, "Figures", planning half).

    python benchmarks/maintenance_plan.py [--nodes 1000] [--per-rack 4]

1,000 x 8-GPU nodes, 4 per rack (a failure domain each), 5 % batches, 90 % floor, per-node
49 min (15 drain + 20 update + 10 reboot + 1 verify + 3 validate level 2), planned twice:
with no window, and inside 'Sat 02:00-06:00 Europe/Berlin'. Also prints the planner's own time.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from gpufleet.maintenance.planner import CampaignNode, PlanLimits, StepDurations, plan_campaign
from gpufleet.maintenance.windows import parse_schedule


def hours(s: float | None) -> str:
    return "n/a" if s is None else f"{s / 3600:,.1f} h"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--per-rack", type=int, default=4)
    args = ap.parse_args()
    nodes = [CampaignNode(f"n{i:05d}", 8, f"r{i // args.per_rack:04d}") for i in range(args.nodes)]
    limits = PlanLimits(batch=max(1, args.nodes * 5 // 100), floor=0.9, per_domain=1)
    durations = StepDurations()
    start = datetime(2026, 12, 1, tzinfo=UTC)
    for label, windows in (
        ("no window", []),
        ("Sat 02:00-06:00 Europe/Berlin", ["Sat 02:00-06:00 Europe/Berlin"]),
    ):
        t = time.perf_counter()
        plan = plan_campaign(nodes, limits, parse_schedule(windows), durations, start)
        took = time.perf_counter() - t
        print(
            f"{label}: {len(plan.nodes)} nodes, {plan.parallelism} at once; expected "
            f"{hours(plan.duration_s)} ({plan.windows_used} window(s)), "
            f"ideal {hours(plan.ideal_s)} "
            f"(ratio {plan.duration_s / plan.ideal_s:.2f}), one at a time {hours(plan.serial_s)} "
            f"({(plan.serial_s or 0) / plan.duration_s:.0f}x longer); lowest in service "
            f"{plan.min_in_service * 100:.1f} % (floor 90 %); planned in {took:.2f} s"
        )


if __name__ == "__main__":
    main()
