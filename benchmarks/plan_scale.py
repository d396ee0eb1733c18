"""Time to plan 1k, 10k and 100k GPUs (target: 100k in under 1 s).

Prints each size's median time and its ratio to the 1k plan measured in the same run; no timed
assertions (machines differ). Run: ``.venv/bin/python benchmarks/plan_scale.py``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpufleet.catalog import load_catalog
from gpufleet.plan.planner import plan
from gpufleet.plan.spec import PlanSpec, load_spec

SIZES = (1_024, 10_240, 102_400)
REPEATS = 5


def spec_doc(gpus: int) -> dict[str, Any]:
    """A training run sized to ``gpus`` GPUs on two candidates, all prices given, as the spec
    file's document (the figures guard writes it for `gpufleet plan`)."""
    return {
        "name": f"scale-{gpus}",
        "candidates": ["h200-sxm", "h100-sxm"],
        "workloads": [
            {
                "kind": "training",
                "model": {
                    "layers": 126,
                    "hidden_size": 16384,
                    "heads": 128,
                    "kv_heads": 8,
                    "vocab_size": 128256,
                    "ffn_hidden_size": 53248,
                    "gated_mlp": True,
                },
                "sequence_length": 8192,
                "global_batch": 16384,
                "tokens": 15e12,
                "gpus": gpus,
            }
        ],
        "constraints": {
            "rack_power": "60 kW",
            "cooling": "liquid",
            "racks_per_row": 20,
            "switch_radix": 128,
        },  # 64-port tops out at 65,536 endpoints
        "prices": {
            "gpu": "30000 USD",
            "energy": "0.08 USD/kWh",
            "switch": "40000 USD",
            "transceiver": "800 USD",
            "cloud_per_gpu_hour": "2.5 USD/hour",
        },
    }


def spec_for(gpus: int) -> PlanSpec:
    """`spec_doc` loaded."""
    return load_spec(spec_doc(gpus))


def time_plan(gpus: int) -> float:
    spec = spec_for(gpus)  # parsing (Pint) is outside the timed part
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        plan(spec)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    load_catalog()
    time_plan(SIZES[0])  # warm caches
    baseline = time_plan(SIZES[0])
    print(f"{'GPUs':>8} {'median s':>10} {'x 1k':>8}")
    for n in SIZES:
        t = baseline if n == SIZES[0] else time_plan(n)
        print(f"{n:>8} {t:>10.4f} {t / baseline:>8.1f}")
    print("target: 100k GPUs in under 1 s")


if __name__ == "__main__":
    main()
