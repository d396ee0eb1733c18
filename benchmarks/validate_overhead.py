"""How close validate's figures come to the device's best, and level 1 wall time at scale.

On a GPU (torch + CUDA): the ratio of the matmul/HBM test's figure to a bare cuBLAS matmul /
bare copy timed in the same run. Everywhere: wall time of level 1 on a simulated 128-node
fleet. Prints ratios; asserts nothing about time.
"""

from __future__ import annotations

import time


def gpu_ratios() -> None:
    try:
        import torch
    except ImportError:
        print("torch not installed: GPU ratios skipped")
        return
    if not torch.cuda.is_available():
        print("no CUDA GPU: GPU ratios skipped")
        return
    from gpufleet.validate.engine_torch import cuda_time_s, matmul_tflops

    n = 8192
    a = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    bare = 2 * n**3 / cuda_time_s(torch, lambda: a @ b, 20) / 1e12
    test, _ok, _err = matmul_tflops(torch, 0, "bf16")
    print(f"matmul bf16: test {test:.1f} / bare {bare:.1f} TFLOP/s = {test / bare:.3f}")
    nbytes = 2 * 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)
    bare_bw = 2 * nbytes / cuda_time_s(torch, lambda: dst.copy_(src), 20) / 1e9
    from gpufleet.validate.engine_torch import TorchEngine
    from gpufleet.validate.judge import Target
    from gpufleet.validate.thresholds import Thresholds

    eng = TorchEngine.open()
    res = eng.hbm_bandwidth([Target(eng.node, 0, None)], Thresholds())[0]
    m = res.metric("copy")
    assert m is not None
    print(f"hbm copy: test {m.value:.0f} / bare {bare_bw:.0f} GB/s = {m.value / bare_bw:.3f}")


def sim_level1(nodes: int = 128) -> None:
    from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec
    from gpufleet.simvalidate import SimEngine
    from gpufleet.validate.runner import RunOptions, run_suite
    from gpufleet.validate.suite import select_tests

    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(f"{nodes}x8xh200"), clock=clock)
    t = time.perf_counter()
    report = run_suite(SimEngine(fleet, clock), RunOptions(tests=select_tests(1), level=1))
    wall = time.perf_counter() - t
    print(
        f"level 1 on {nodes} simulated nodes ({nodes * 8} GPUs): {wall:.2f} s wall, "
        f"{wall / (nodes * 8) * 1000:.2f} ms per GPU, status {report.status.value}"
    )


if __name__ == "__main__":
    gpu_ratios()
    sim_level1()
