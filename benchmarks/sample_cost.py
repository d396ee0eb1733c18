"""CPU time per full sample of one GPU (fast and slow tier), on the simulator and - where
``pynvml.nvmlInit()`` works - on real NVML, against one ``nvidia-smi --query-gpu`` call for the
same fields (`gpufleet.devices.smi.QUERY_FIELDS`). Prints ratios; asserts nothing.

Where nvidia-smi is absent the H200 reference is printed instead and labelled as such: one
``nvidia-smi --query-gpu`` call costs ~25 ms of CPU (tests/fixtures/nvidia-h200/README.md).

    python benchmarks/sample_cost.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import time
from typing import Any

from gpufleet.devices.nvml.backend import NvmlBackend
from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
from gpufleet.devices.smi import QUERY_FIELDS

SMI_REFERENCE_MS = 25.0  # tests/fixtures/nvidia-h200/README.md: one --query-gpu call, CPU
TARGET_RATIO = 100.0  # issue 3: the agent's NVML sampling at least 100x cheaper than nvidia-smi


def cpu_per_call_us(fn: Any, rounds: int) -> float:
    fn()  # warm up (handles, lazy init)
    t0 = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - t0) / rounds * 1e6


def smi_cpu_ms(rounds: int = 5) -> float | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = ",".join(QUERY_FIELDS)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(rounds):
        subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv", "-i", "0"],
            capture_output=True,
            check=False,
            timeout=60,
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / rounds * 1e3


def measure(backend: NvmlBackend, rounds: int, label: str) -> float:
    fast = cpu_per_call_us(lambda: backend.sample_fast(0), rounds)
    slow = cpu_per_call_us(lambda: backend.sample_slow(0), max(5, rounds // 20))
    print(f"{label}: fast tier {fast:8.1f} us CPU per GPU per sample")
    print(f"{label}: slow tier {slow:8.1f} us CPU per GPU per sample")
    return fast


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()

    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec("1x1xh200"), clock=clock)
    sim_backend = next(iter(fleet.nodes.values())).backend()
    sim_fast = measure(sim_backend, args.rounds, "simulator")

    smi_ms = smi_cpu_ms()
    if smi_ms is None:
        smi_ms = SMI_REFERENCE_MS
        smi_note = "reference (H200 capture, nvidia-smi not installed here)"
    else:
        smi_note = "measured here"
    print(f"nvidia-smi --query-gpu ({len(QUERY_FIELDS)} fields): {smi_ms:.1f} ms CPU, {smi_note}")
    print(
        f"simulator fast tier vs nvidia-smi: ratio {smi_ms * 1e3 / sim_fast:.0f} x "
        "(the simulator's physics runs in Python: an upper bound, not the NVML cost)"
    )

    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver here
        print(f"real NVML: not available ({type(exc).__name__}); skipped")
        return
    real = NvmlBackend(lib=pynvml)
    try:
        real_fast = measure(real, args.rounds, "real NVML")
    finally:
        real.close()
    ratio = smi_ms * 1e3 / real_fast
    print(
        f"real NVML: {real_fast:.1f} us CPU per GPU per sample; nvidia-smi: {smi_ms:.1f} ms; "
        f"ratio {ratio:.0f} x (target >= {TARGET_RATIO:.0f} x)"
    )


if __name__ == "__main__":
    main()
