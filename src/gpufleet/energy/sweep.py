"""`power sweep`: run a workload at each power limit, measure throughput and energy, and put
the original limits back afterwards, whatever happens (error, Ctrl-C). The second knob, locked
SM clocks, sweeps with the same measurement step: `gpufleet.energy.clocks`.

A sweep of ``CURRENT`` (``limits=None``) measures at the limit in force and never calls NVML's
set-limit function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufleet.energy.counter import window_energy
from gpufleet.energy.workloads import Runner, RunResult
from gpufleet.errors import DeviceError, UsageError

WARMUP_FRACTION = 0.1  # of each step, to let clocks and power settle before measuring


@dataclass(frozen=True)
class SweepPoint:
    """One limit's measurement, all GPUs of the sweep together."""

    limit_w: float | None  # None: the limits in force differ between GPUs
    seconds: float
    work: float  # in the runner's unit x seconds (TFLOP, GB, ...)
    energy_j: float | None
    energy_method: str | None  # "counter", "power" or None

    @property
    def throughput(self) -> float:
        return self.work / self.seconds if self.seconds > 0 else 0.0

    @property
    def power_w(self) -> float | None:
        return None if self.energy_j is None or self.seconds <= 0 else self.energy_j / self.seconds

    @property
    def energy_per_work(self) -> float | None:
        return None if self.energy_j is None or self.work <= 0 else self.energy_j / self.work


@dataclass(frozen=True)
class SweepResult:
    """The curve: one point per limit, in sweep order."""

    unit: str
    gpus: tuple[int, ...]
    points: tuple[SweepPoint, ...]
    original_limits_w: dict[int, float | None]
    restored: bool


Progress = Callable[[int, int, float | None], None]


def parse_limits(text: str) -> list[float] | None:
    """``700,650,...,350`` (a step inferred from the first two), ``700,600,500`` or ``CURRENT``
    (None: measure at the limit in force, set nothing)."""
    t = text.strip()
    if t.upper() == "CURRENT":
        return None
    parts = [p.strip() for p in t.split(",") if p.strip()]
    if "..." in parts:
        i = parts.index("...")
        if i != 2 or len(parts) != 4:
            raise UsageError("--limits: write A,B,...,Z (first two give the step)")
        try:
            a, b, z = float(parts[0]), float(parts[1]), float(parts[3])
        except ValueError as exc:
            raise UsageError(f"--limits: not a number in {text!r}") from exc
        step = b - a
        if step == 0 or (z - a) / step < 0:
            raise UsageError(f"--limits: {text!r} does not reach {z:g} W")
        n = round((z - a) / step)
        out = [a + k * step for k in range(n + 1)]
    else:
        try:
            out = [float(p.removesuffix("W").removesuffix("w")) for p in parts]
        except ValueError as exc:
            raise UsageError(f"--limits: not a number in {text!r}") from exc
    if not out or any(x <= 0 for x in out):
        raise UsageError(f"--limits: give positive watts, got {text!r}")
    return out


def _check_range(backend: object, gpus: Sequence[int], limits: Sequence[float]) -> None:
    for g in gpus:
        rng = backend.power_limit_constraints_w(g)  # type: ignore[attr-defined]
        if rng is None:
            continue
        bad = [x for x in limits if not rng[0] - 1e-6 <= x <= rng[1] + 1e-6]
        if bad:
            raise UsageError(
                f"--limits: {', '.join(f'{x:g}' for x in bad)} W outside GPU {g}'s allowed "
                f"{rng[0]:g}-{rng[1]:g} W"
            )


def limit_in_force(backend: object, gpus: Sequence[int]) -> float | None:
    """The GPUs' common power limit; None when they differ."""
    now = {backend.power_limit_w(g) for g in gpus}  # type: ignore[attr-defined]
    return now.pop() if len(now) == 1 else None


def measure(
    backend: object, gpus: Sequence[int], runner: Runner, seconds: float
) -> tuple[RunResult, float | None, str | None]:
    """One step of a sweep: warm up, run ``seconds``, and the energy of the GPUs together
    (the counter's, else integrated power: `gpufleet.energy.counter`) and how it was got."""
    b = backend
    warm = seconds * WARMUP_FRACTION
    if warm > 0:
        runner.run(gpus, warm)
    before = {g: b.total_energy_mj(g) for g in gpus}  # type: ignore[attr-defined]
    res = runner.run(gpus, seconds)
    after = {g: b.total_energy_mj(g) for g in gpus}  # type: ignore[attr-defined]
    joules: float | None = 0.0
    methods = set()
    for g in gpus:
        e = window_energy(before[g], after[g], res.power_j.get(g))
        methods.add(e.method)
        joules = None if joules is None or e.joules is None else joules + e.joules
    return res, joules, "+".join(sorted(m for m in methods if m)) or None


def sweep(
    backend: object,
    gpus: Sequence[int],
    limits: Sequence[float] | None,
    runner: Runner,
    seconds: float,
    *,
    progress: Progress | None = None,
) -> SweepResult:
    """Measure ``runner`` at each limit (None: only at the limits in force, nothing set)."""
    b = backend
    original = {g: b.power_limit_w(g) for g in gpus}  # type: ignore[attr-defined]
    if limits is not None:
        _check_range(b, gpus, limits)
        unknown = [g for g, v in original.items() if v is None]
        if unknown:
            raise DeviceError(
                f"GPU(s) {unknown}: NVML does not report the power limit, so it could not be "
                "restored after the sweep; not sweeping"
            )
    steps: list[float | None] = list(limits) if limits is not None else [None]
    points: list[SweepPoint] = []
    changed = False
    restored = limits is None
    try:
        for k, limit in enumerate(steps):
            if progress:
                progress(k, len(steps), limit)
            if limit is not None:
                for g in gpus:
                    if original[g] is None or abs(float(b.power_limit_w(g) or 0) - limit) > 0.5:  # type: ignore[attr-defined]
                        changed = True
                        b.set_power_limit_w(g, limit)  # type: ignore[attr-defined]
            res, joules, method = measure(b, gpus, runner, seconds)
            points.append(
                SweepPoint(
                    limit_w=limit if limit is not None else limit_in_force(b, gpus),
                    seconds=res.seconds,
                    work=sum(res.work.values()),
                    energy_j=joules,
                    energy_method=method,
                )
            )
        if progress:
            progress(len(steps), len(steps), None)
    finally:
        if changed:
            restore_limits(b, original)
            restored = True
    return SweepResult(runner.unit, tuple(gpus), tuple(points), original, restored)


def restore_limits(backend: object, limits: dict[int, float | None]) -> None:
    """Put each GPU's limit back; every GPU is tried, failures reported together."""
    failed: list[str] = []
    for g, w in limits.items():
        if w is None:
            continue
        try:
            backend.set_power_limit_w(g, w)  # type: ignore[attr-defined]
        except DeviceError as exc:
            failed.append(str(exc))
    if failed:
        raise DeviceError("could not restore the power limit: " + "; ".join(failed))
