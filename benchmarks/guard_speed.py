"""The figures guard's machine-speed sampler: how fast this machine runs a fixed workload
*while each figure is measured*, so that a budget can follow the machine.

CPU time is steady under load from other processes, but not across machines, and not over time
on a shared virtual machine: on the 2-core development machine (2026-12-02) the same pure-Python
loop took 0.089 s in one guard run and 0.141 s a few minutes later, and the figures moved with
it (``validate`` 9 s of CPU one hour, 22 s the next). A single calibration before the run could
not follow that, and it failed a correct tree. So a child process (`sample_forever`, started by
`SpeedSampler`) runs `workload` about once a second for the whole guard run and reports each
run's CPU time with its end time (``CLOCK_MONOTONIC``, the same in every process); a figure's
budget is scaled by the median of the runs that ended while that figure was measured, against
`REFERENCE_S` (`SpeedSampler.factor`). The budgets in ``guard_budgets.json`` are figures at
that reference speed (a stressed run's value divided by its factor, times 1.5).

`workload` mixes what the figures spend their CPU on: dict and string work (a pure-Python
loop), compiling Python source (the CLI imports gpufleet from source), dataclasses to JSON (the
reports) and a ring of threads handing a token on (NVML lanes, server threads). Each part on
its own moved between runs by as much as the whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

# `workload`'s CPU time on the machine and at the moment the budgets were set: the median of
# the sampler's runs during the two stressed baseline runs of 2026-12-03 (see guard_budgets.json).
REFERENCE_S = 0.296
INTERVAL_S = 1.0  # a run starts about this long after the previous one started
SLACK_S = 1.5  # a run that ended this long after a figure's end still overlapped it


def _dict_loop() -> None:
    d: dict[str, int] = {}
    for i in range(200_000):
        d[str(i)] = i * 2
    sum(v for v in d.values() if v % 3)


_SOURCE = "\n".join(
    f"def f{i}(a, b=({i}, 'x{i}')):\n    c = [x * {i} for x in range(a) if x % 3]\n"
    f"    return {{'k{i}': c, 'b': b, 's': f'{{a}}-{{b}}'}}\n"
    for i in range(400)
)


def _compile() -> None:
    compile(_SOURCE, "<guard-speed>", "exec")


@dataclasses.dataclass
class _Leaf:
    name: str
    value: float
    tags: list[str]


@dataclasses.dataclass
class _Branch:
    name: str
    leaves: list[_Leaf]


_TREE = [
    _Branch(f"b{i}", [_Leaf(f"l{j}", j * 0.5, ["a", "b"]) for j in range(40)]) for i in range(60)
]


def _to_json() -> None:
    json.dumps([dataclasses.asdict(b) for b in _TREE])


def _thread_ring(threads: int = 16, laps: int = 150) -> None:
    events = [threading.Event() for _ in range(threads)]
    done = threading.Event()

    def run(k: int) -> None:
        for lap in range(laps):
            events[k].wait()
            events[k].clear()
            if k == threads - 1 and lap == laps - 1:
                done.set()
                return
            events[(k + 1) % threads].set()

    ring = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for t in ring:
        t.start()
    events[0].set()
    done.wait(timeout=60)
    for t in ring:
        t.join(timeout=10)


PARTS = (_dict_loop, _compile, _to_json, _thread_ring)


def workload() -> float:
    """CPU seconds (this process, every thread) of one run of the fixed mix."""
    t0 = time.process_time()
    for part in PARTS:
        part()
    return time.process_time() - t0


def sample_forever() -> None:
    """The sampler child: a line ``END_MONOTONIC CPU_S`` per run, until stdin closes (the guard
    exited or stopped it)."""
    while True:
        started = time.monotonic()
        cpu = workload()
        print(f"{time.monotonic():.3f} {cpu:.5f}", flush=True)
        wait = max(0.05, INTERVAL_S - (time.monotonic() - started))
        ready, _, _ = select.select([sys.stdin], [], [], wait)
        if ready and not sys.stdin.readline():
            return


def factor_of(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """This machine's slowness over [t0, t1] against `REFERENCE_S`: the median CPU time of the
    runs that ended in it (or up to `SLACK_S` after) over the reference; the run just before
    t0 when none did; None without any run."""
    inside = [cpu for end, cpu in samples if t0 <= end <= t1 + SLACK_S]
    if not inside:
        before = [cpu for end, cpu in samples if end < t0]
        inside = before[-1:]
    return statistics.median(inside) / REFERENCE_S if inside else None


class SpeedSampler:
    """Runs `sample_forever` in a child process and collects its runs; `factor` for a span."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--sample"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": ""},
        )
        self._reader = threading.Thread(target=self._read, name="guard-speed", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                end, cpu = (float(x) for x in line.split())
            except ValueError:
                continue
            with self._lock:
                self.samples.append((end, cpu))

    def wait_first(self, timeout_s: float = 30.0) -> None:
        """Until the first run is in (the child's start-up is not a figure's span)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._proc.poll() is None:
            with self._lock:
                if self.samples:
                    return
            time.sleep(0.05)

    def factor(self, t0: float, t1: float) -> float | None:
        """`factor_of` over the runs so far (the guard asks once every figure is measured)."""
        with self._lock:
            samples = list(self.samples)
        return factor_of(samples, t0, t1)

    def close(self) -> None:
        """Stop the child once its current run is in (the last figure's span ends in it)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=10)


if __name__ == "__main__" and sys.argv[1:] == ["--sample"]:
    sample_forever()
