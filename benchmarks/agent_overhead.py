"""The agent's own cost: CPU use for a simulated 8-GPU node sampled at 1 Hz (process CPU time
over wall time; target < 1 % of one core), and the /metrics render time for 8 GPUs and for
8 GPUs x 7 MIG instances. Ratios are against baselines measured in the same run; no timed
assertions. On a GPU machine it also runs the agent loop on real NVML.

    python benchmarks/agent_overhead.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import math
import threading
import time

import numpy as np
from prometheus_client import generate_latest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.devices.sim import Load, SimFleet, parse_fleet_spec
from gpufleet.telemetry.metrics import MIG_COLUMNS
from gpufleet.telemetry.ring import RingBuffer
from gpufleet.telemetry.sampler import MigInstance

TARGET_CPU_PCT = 1.0  # issue 3: under 1 % of one core


def cpu_pct_of_loop(agent: Agent, seconds: float) -> float:
    stop = threading.Event()
    c0, w0 = time.process_time(), time.monotonic()
    agent.run(stop, duration_s=seconds)
    return (time.process_time() - c0) / (time.monotonic() - w0) * 100


def idle_cpu_pct(seconds: float) -> float:
    """Baseline: the same process doing nothing for the same time."""
    c0, w0 = time.process_time(), time.monotonic()
    threading.Event().wait(seconds)
    return (time.process_time() - c0) / (time.monotonic() - w0) * 100


def render_us(agent: Agent, rounds: int = 200) -> tuple[float, float]:
    """(our renderer, prometheus_client.generate_latest) wall microseconds per scrape."""
    agent.render_metrics()
    t0 = time.perf_counter()
    for _ in range(rounds):
        agent.render_metrics()
    ours = (time.perf_counter() - t0) / rounds * 1e6
    t0 = time.perf_counter()
    for _ in range(rounds):
        generate_latest(agent.registry)
    theirs = (time.perf_counter() - t0) / rounds * 1e6
    return ours, theirs


def add_mig(agent: Agent, per_gpu: int = 7) -> None:
    for g in agent.sampler.gpus:
        for gi in range(per_gpu):
            ring = RingBuffer(MIG_COLUMNS, 8)
            row = np.full(len(MIG_COLUMNS), math.nan)
            row[MIG_COLUMNS.index("mem_used_bytes")] = (gi + 1) * 2**30
            row[MIG_COLUMNS.index("mem_free_bytes")] = 9 * 2**30
            row[MIG_COLUMNS.index("prof_gr_engine_active")] = 0.5
            ring.append(time.time(), row)
            g.mig.append(MigInstance(gi_id=gi + 7, profile="1g.10gb", ring=ring))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    fleet = SimFleet(parse_fleet_spec("1x8xh100"))
    node = next(iter(fleet.nodes.values()))
    for i, gpu in enumerate(node.gpus):
        gpu.run(Load(util=(i + 1) / 8))
    agent = Agent(node.backend(), AgentConfig(fast_interval_s=1.0, slow_interval_s=30.0))
    base = idle_cpu_pct(min(args.seconds, 3.0))
    pct = cpu_pct_of_loop(agent, args.seconds)
    print(f"baseline (idle process): {base:.3f} % of one core")
    print(
        f"agent, simulated 8-GPU node at 1 Hz: {pct:.2f} % of one core "
        f"(target < {TARGET_CPU_PCT} %; includes the simulator's Python physics), "
        f"{agent.sampler.ticks} rounds"
    )
    ours, theirs = render_us(agent)
    print(
        f"/metrics render, 8 GPUs: {ours:.0f} us (prometheus_client.generate_latest on the "
        f"same collector: {theirs:.0f} us; ratio {theirs / ours:.2f} x)"
    )
    add_mig(agent)
    ours_mig, theirs_mig = render_us(agent, 100)
    print(
        f"/metrics render, 8 GPUs x 7 MIG instances: {ours_mig:.0f} us "
        f"(generate_latest: {theirs_mig:.0f} us; {ours_mig / ours:.2f} x the 8-GPU render)"
    )
    agent.close()

    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:
        print(f"real NVML: not available ({type(exc).__name__}); skipped")
        return
    from gpufleet.devices.nvml.backend import NvmlBackend

    real = NvmlBackend(lib=pynvml)
    n = real.device_count()
    ragent = Agent(real, AgentConfig(fast_interval_s=1.0))
    pct_real = cpu_pct_of_loop(ragent, args.seconds)
    per_gpu_us = pct_real / 100 * 1e6 / max(1, n)
    print(
        f"real NVML agent: {pct_real:.3f} % of one core for {n} GPU(s) at 1 Hz = "
        f"{per_gpu_us:.0f} us CPU per GPU per second (target < {TARGET_CPU_PCT} % per node)"
    )
    ragent.close()
    real.close()


if __name__ == "__main__":
    main()
