"""Wall time of ``gpufleet health`` as slurmd's HealthCheckProgram runs it (a fresh process),
on a simulated node with four hung GPUs, against the same check on a healthy node measured in
the same run, and against the 10 s budget docs/slurm.md promises.

The Slurm calls are left out (no slurmd here): what a hung GPU costs is the NVML deadline, and
that is what the ratio shows. Prints figures and ratios; asserts nothing about time.

    .venv/bin/python benchmarks/health_hung.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.testing.procs import child_env

BUDGET_S = 10.0  # gpufleet.schedulers.slurm.health_check.BUDGET_S


def _fleet(path: Path, hung: bool) -> Path:
    faults = "".join(
        f"  - {{kind: hung_call, node: gpu2, gpu: {g}, at_s: 0, seconds: 600}}\n"
        for g in (1, 3, 5, 7)
    )
    path.write_text(
        "nodes:\n  - {name: gpu2, model: h100-sxm, gpus: 8}\n"
        + (f"faults:\n{faults}" if hung else "")
    )
    return path


def _run(fleet: Path) -> tuple[float, int]:
    argv = [sys.executable, "-m", "gpufleet", "health", "--sim", str(fleet), "--node", "gpu2"]
    argv += ["--exit-code", "--duration", "1"]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return time.monotonic() - t0, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.environ.update(child_env())  # the children run the gpufleet this process imports
    with tempfile.TemporaryDirectory() as d:
        healthy = _fleet(Path(d) / "healthy.yaml", hung=False)
        hung = _fleet(Path(d) / "hung.yaml", hung=True)
        base = min(_run(healthy)[0] for _ in range(args.runs))
        runs = [_run(hung) for _ in range(args.runs)]
    worst = max(t for t, _ in runs)
    codes = sorted({rc for _, rc in runs})
    print(f"healthy node: best {base:.2f} s of {args.runs}")
    print(f"four hung GPUs: worst {worst:.2f} s of {args.runs} (exit codes {codes})")
    share = worst / BUDGET_S
    print(f"hung / healthy: {worst / base:.2f}x; hung / {BUDGET_S:.0f} s budget: {share:.2f}")


if __name__ == "__main__":
    main()
