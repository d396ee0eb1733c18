"""What a power sweep runs at each limit: a built-in workload on the simulator, or a user's
command whose printed rate is parsed with a regex.

A runner runs its work on a set of GPUs for a while and reports the work done per GPU (in its
unit: TFLOP for ``matmul-bf16``, GB for ``hbm``, whatever the command's rate counts) and the
power it sampled meanwhile (the energy fallback when the counter is missing or reset).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.catalog import performance as perf
from gpufleet.catalog import power as pw
from gpufleet.catalog.loader import load_catalog
from gpufleet.errors import ConfigError, UsageError

BUILTIN = ("matmul-bf16", "hbm")
SIM_STEP_S = 0.5


@dataclass
class RunResult:
    """Work done per GPU, wall seconds, and the integral of sampled power per GPU (J)."""

    work: dict[int, float]
    seconds: float
    power_j: dict[int, float] = field(default_factory=dict)


class Runner(Protocol):
    """Runs the workload on GPUs for a number of seconds."""

    unit: str

    def run(self, gpus: Sequence[int], seconds: float) -> RunResult: ...


class SimRunner:
    """A built-in workload on simulated GPUs: it schedules the profile's load, advances the
    simulator's manual clock, and counts work from the SM clock NVML reports (the catalog's
    power model: ``gpufleet.catalog.power``)."""

    def __init__(self, node: Any, backend: Any, clock: Any, workload: str) -> None:
        from gpufleet.devices.sim.gpu import Load

        self.profile = pw.profile(workload)
        self.unit = self.profile.unit
        self._node, self._backend, self._clock = node, backend, clock
        self._load = Load(
            util=1.0,
            intensity=self.profile.intensity,
            static=self.profile.static,
            mem_util=0.25 if workload == "matmul-bf16" else 0.95,
            kind="bf16_matmul" if workload == "matmul-bf16" else "hbm_copy",
        )
        self._workload = workload

    def _peak(self, gpu: int) -> tuple[float, float]:
        model = load_catalog().gpus[self._node.gpus[gpu].model.key]
        peak = (
            perf.matmul_tflops(model, "bf16") or 0.0
            if self._workload == "matmul-bf16"
            else perf.hbm_copy_gbps(model)
        )
        return peak, float(model.max_sm_clock_mhz or 1980)

    def run(self, gpus: Sequence[int], seconds: float) -> RunResult:
        start = self._clock()
        for g in gpus:
            self._node.gpus[g].run(self._load, start_s=start, duration_s=seconds)
        peaks = {g: self._peak(g) for g in gpus}
        work = dict.fromkeys(gpus, 0.0)
        power = dict.fromkeys(gpus, 0.0)
        done = 0.0
        while done < seconds - 1e-9:
            dt = min(SIM_STEP_S, seconds - done)
            self._clock.advance(dt)
            done += dt
            for g in gpus:
                s = self._backend.sample_fast(g)
                peak, fmax = peaks[g]
                ratio = float(s.sm_clock_mhz or 0) / fmax
                work[g] += peak * self.profile.relative_throughput(ratio) * dt
                power[g] += float(s.power_w or 0.0) * dt
        return RunResult(work, self._clock() - start, power)


class CommandRunner:
    """A user's command, run once per limit with CUDA_VISIBLE_DEVICES set to the GPUs; its rate
    is the mean of the numbers ``rate_regex``'s first group captures from its output. The
    command runs until it exits or ``seconds`` pass (then it is stopped: a benchmark that loops
    forever is fine)."""

    def __init__(
        self,
        command: str,
        rate_regex: str,
        unit: str = "units/s",
        sample_power: Callable[[int], float | None] | None = None,
    ) -> None:
        try:
            self._re = re.compile(rate_regex)
        except re.error as exc:
            raise UsageError(f"--rate-regex: not a regular expression: {exc}") from exc
        if self._re.groups < 1:
            raise UsageError("--rate-regex: needs one (group) around the number")
        self._argv = shlex.split(command)
        if not self._argv:
            raise UsageError("--workload: empty command")
        self.unit = unit
        self._sample_power = sample_power

    def run(self, gpus: Sequence[int], seconds: float) -> RunResult:
        import os

        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus))
        t0 = time.monotonic()
        power = dict.fromkeys(gpus, 0.0)
        try:
            proc = subprocess.Popen(  # the user's own command, no shell
                self._argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        except OSError as exc:
            raise ConfigError(f"--workload: cannot run {self._argv[0]!r}: {exc}") from exc
        last = t0
        while proc.poll() is None and time.monotonic() - t0 < seconds:
            time.sleep(0.2)
            now = time.monotonic()
            if self._sample_power is not None:
                for g in gpus:
                    w = self._sample_power(g)
                    power[g] += (w or 0.0) * (now - last)
            last = now
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        out, _ = proc.communicate()
        elapsed = time.monotonic() - t0
        rates = [float(m.group(1)) for m in self._re.finditer(out or "")]
        if not rates:
            raise ConfigError(
                f"--rate-regex {self._re.pattern!r} matched nothing in the command's output",
                hint=f"last output: {(out or '').strip()[-200:]!r}",
            )
        rate = sum(rates) / len(rates)
        # a command's rate is for all its GPUs together: split evenly
        per = rate * elapsed / max(1, len(gpus))
        return RunResult(dict.fromkeys(gpus, per), elapsed, power)
