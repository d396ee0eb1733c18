"""The figures guard: the project's headline figures, measured in CPU time of the user's own
process (user + system: far steadier than wall time on a loaded machine), each held to a budget.

Every figure goes through the path a user takes: the installed CLI (``gpufleet`` beside this
Python, else ``python -m gpufleet``) in a process of its own, and HTTP to a real
``gpufleet controller`` process. A process that exits is measured from its ``os.wait4``
rusage; a long-running one (agent, controller) from /proc (below). A whole run takes about
60 s on the 2-core development machine, 85-95 s with ``stress-ng --cpu 2`` beside it.

==============================  ================================================================
cli_version_cpu_s               ``gpufleet --version`` (median of 3)
cli_help_cpu_s                  ``gpufleet --help`` (median of 3)
cli_status_sim_cpu_s            ``gpufleet status --sim 1x8xh100 --json`` (median of 3)
validate_l1_1024_cpu_s          ``gpufleet validate --sim 128x8xh100 --level 1 --json`` (once)
agent_cpu_pct_8gpu_1hz          ``gpufleet agent --sim 1x8xh100`` at 1 Hz, no controller: its
                                CPU over 10 s after a 3 s warm-up, in % of one core (it runs
                                alongside the four figures above, one process at a time)
agent_rss_mib                   that agent's VmRSS at the end
controller_cpu_ms_per_batch     ``gpufleet controller`` (SQLite in a temporary directory): 24
                                nodes' default agent batches (8 GPUs x 5 samples, rendered by the
                                real agent: ``benchmarks/ingest.py render_pool``), registered and
                                warmed, then 300 more over 8 keep-alive connections; controller
                                CPU per batch
plan_100k_cpu_s                 ``gpufleet plan`` of a 102,400-GPU spec (``plan_scale.py``'s
                                100k) with ``--cable-map`` and ``--bom`` files and ``--json``
dashboard_api_cpu_ms_10k        a controller holding 10,000 nodes x 8 GPUs, each with one
                                telemetry batch: the API calls of the dashboard's first render
                                (``/whoami``, ``/summary``; then the overview's ``/heatmap``
                                grouped by rack, the attention list, ``/summary``, active
                                ``/findings``) made 10 times; CPU per set of the threads that
                                serve them (below)
controller_rss_kib_per_node     (VmRSS of that controller loaded - VmRSS of the same controller
                                on the empty database) / 10,000
==============================  ================================================================

The 10,000 nodes go into the database in bulk (`gpufleet.testing.bulkfleet.register`, as
``dashboard_render.py`` does: seconds) while no controller runs; registering them over HTTP
(an agent's first batch each) took 70 s here, past this guard's time. The controller then
starts on that database and takes one telemetry batch per node over HTTP (the real ingest path;
15-25 s), and serves the calls. The empty controller's RSS comes from the same data directory
before the bulk insert, after one set of the same calls.

CPU of a long-running process is the sum of its threads' run times (``/proc/PID/task/*/
schedstat``, nanoseconds) where that is exact; else utime + stime from ``/proc/PID/stat`` (clock
ticks: the agent uses 3 to 5 of them in 10 s). At 10,000 nodes the controller's own loop (its
writer flushing 80,000 GPUs' rollups every 15 s, the 1 s tick) costs 0.1-0.8 of a core, as much
as the calls: the dashboard figure counts only the threads that serve requests, the event loop
(the main thread) and the threads that did nothing during 1.5 s without requests just before.

Prints a table (``figure | value | budget | ratio | ok/OVER``) and the load averages (``--json``:
one object, ``results`` the list); exits 1 when a figure is over its budget or could not be
measured, 0 otherwise, 2 on bad usage or a bad budgets file (one line), 130 on Ctrl-C.
Budgets: ``benchmarks/guard_budgets.json`` (``{figure: {"budget": x, "unit": u, "why": ...}}``).
Budgets are figures at a reference machine speed: while the figures are measured, a child
process runs a fixed workload about once a second (``benchmarks/guard_speed.py``), and each
CPU budget is raised by how much slower that workload ran during that figure's measurement
(the ``speed`` column; never below 1), so a slower or busier machine is not a regression and
a 10x regression still fails.

``--plant KIND`` proves the guard bites, without touching ``src/``: the children get a
``sitecustomize.py`` first on their ``PYTHONPATH`` (chaining any other one), which for
``cli-start`` burns 5x the CPU a gpufleet CLI interpreter used when it exits, and for
``validate`` wraps ``gpufleet.validate.runner.run_suite`` to burn 5x the CPU each run took.

Every child runs in a session of its own (and dies with the guard: ``PR_SET_PDEATHSIG``); all
are stopped, and the temporary directory removed, on exit, Ctrl-C, SIGTERM or an exception.

This file is the command, the budgets and the verdicts; the measurements are in
``benchmarks/guard_figures.py``, the planted regressions in ``benchmarks/guard_plants.py``.

    python benchmarks/guard.py [--json] [--only NAME[,NAME]] [--budgets FILE] [--plant KIND]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

# the measuring side and the plants live beside this file, imported as ``benchmarks.*`` from
# this tree whether the guard runs as a script or is loaded from its path (as the tests do)
if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

from benchmarks.guard_figures import (
    AFTER_AGENT,
    AGENT,
    ALONGSIDE_AGENT,
    Ctx,
    MeasureError,
    Values,
    finish_agent,
    start_agent,
)
from benchmarks.guard_plants import PLANTS, GuardError
from benchmarks.guard_speed import REFERENCE_S, SpeedSampler

DEFAULT_BUDGETS = Path(__file__).resolve().with_name("guard_budgets.json")

# figure -> unit; the order is the table's
UNITS: dict[str, str] = {
    "cli_version_cpu_s": "s",
    "cli_help_cpu_s": "s",
    "cli_status_sim_cpu_s": "s",
    "validate_l1_1024_cpu_s": "s",
    "agent_cpu_pct_8gpu_1hz": "%",
    "agent_rss_mib": "MiB",
    "controller_cpu_ms_per_batch": "ms",
    "plan_100k_cpu_s": "s",
    "dashboard_api_cpu_ms_10k": "ms",
    "controller_rss_kib_per_node": "KiB",
}
FIGURES = tuple(UNITS)
CPU_UNITS = frozenset({"s", "%", "ms"})  # CPU-time figures; MiB and KiB are memory


# -- the pure part: budgets, verdicts, output --------------------------------------------------


@dataclass(frozen=True)
class Budget:
    budget: float
    unit: str
    why: str


@dataclass(frozen=True)
class Result:
    figure: str
    value: float | None  # None: not measured (``error`` says why)
    budget: float
    unit: str
    raw: tuple[float, ...] = ()  # the readings behind the value
    error: str | None = None
    speed: float | None = None  # the machine's slowness while it was measured (guard_speed)

    @property
    def ratio(self) -> float | None:
        return None if self.value is None else self.value / self.budget

    @property
    def ok(self) -> bool:
        return self.value is not None and self.value <= self.budget

    @property
    def status(self) -> str:
        if self.value is None:
            return "ERROR"
        return "ok" if self.ok else "OVER"


def load_budgets(path: Path) -> dict[str, Budget]:
    """The budgets file, checked: every entry a known figure with a positive ``budget``, the
    figure's ``unit`` and a ``why``. Raises `GuardError` naming the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GuardError(f"budgets file {path}: not found") from None
    except OSError as exc:
        raise GuardError(f"budgets file {path}: cannot read ({exc.strerror})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GuardError(
            f"budgets file {path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(doc, dict):
        raise GuardError(f"budgets file {path}: must be an object {{figure: {{budget, unit}}}}")
    out: dict[str, Budget] = {}
    for name, entry in doc.items():
        if name not in UNITS:
            raise GuardError(
                f"budgets file {path}: unknown figure {name!r} (known: {', '.join(FIGURES)})"
            )
        if not isinstance(entry, dict):
            raise GuardError(f"budgets file {path}: {name}: must be an object")
        b = entry.get("budget")
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b <= 0:
            raise GuardError(f"budgets file {path}: {name}.budget: must be a positive number")
        unit = entry.get("unit")
        if unit != UNITS[name]:
            raise GuardError(
                f"budgets file {path}: {name}.unit: must be {UNITS[name]!r}, not {unit!r}"
            )
        why = entry.get("why", "")
        if not isinstance(why, str):
            raise GuardError(f"budgets file {path}: {name}.why: must be a string")
        out[name] = Budget(float(b), unit, why)
    return out


def choose_figures(only: str | None, budgets: dict[str, Budget], path: Path) -> list[str]:
    """The figures to run (``--only A,B`` or all), each with a budget, in table order."""
    wanted = list(FIGURES)
    if only is not None:
        names = [n.strip() for n in only.split(",") if n.strip()]
        if not names:
            raise GuardError("--only: no figure named")
        unknown = [n for n in names if n not in UNITS]
        if unknown:
            raise GuardError(f"--only: unknown figure {unknown[0]!r} (known: {', '.join(FIGURES)})")
        wanted = [f for f in FIGURES if f in names]
    missing = [f for f in wanted if f not in budgets]
    if missing:
        raise GuardError(f"budgets file {path}: no entry for {missing[0]!r}")
    return wanted


def judge(
    figure: str,
    value: float | None,
    budget: Budget,
    raw: Sequence[float] = (),
    error: str | None = None,
    speed: float | None = None,
) -> Result:
    """``value`` against ``budget`` raised by `speed_factor` of ``speed``."""
    b = scale_budget(budget, speed_factor(speed))
    return Result(figure, value, b.budget, b.unit, tuple(raw), error, speed)


def speed_factor(measured: float | None) -> float:
    """How much a CPU budget is raised for a figure measured at ``measured`` (its span's
    `guard_speed.factor_of`): that factor, never below 1 (a faster moment keeps the budget as
    set); 1 when the sampler gave nothing."""
    return 1.0 if measured is None else max(1.0, measured)


def scale_budget(budget: Budget, factor: float) -> Budget:
    """A CPU-time budget times ``factor``; a memory budget as it is."""
    if budget.unit not in CPU_UNITS:
        return budget
    return Budget(budget.budget * factor, budget.unit, budget.why)


def _num(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def format_table(results: Sequence[Result], meta: dict[str, Any]) -> str:
    """The human table (``speed``: how much slower than the budgets' reference the machine ran
    while the figure was measured, the factor its CPU budget was raised by when above 1), then
    one line on the load and the verdict."""
    rows = [("figure", "value", "budget", "speed", "ratio", "ok/OVER")]
    for r in results:
        value = "-" if r.value is None else f"{_num(r.value)} {r.unit}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        speed = "-" if r.speed is None or r.unit not in CPU_UNITS else f"x{r.speed:.2f}"
        rows.append((r.figure, value, f"{_num(r.budget)} {r.unit}", speed, ratio, r.status))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = []
    for k, row in enumerate(rows):
        cells = [
            row[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(row[1:5], widths[1:5], strict=True)),
        ]
        lines.append(" | ".join([*cells, row[5]]).rstrip())
        if k == 0:
            lines.append("-+-".join("-" * w for w in widths))
    for r in results:
        if r.error:
            lines.append(f"{r.figure}: {r.error}")
    over = [r.figure for r in results if not r.ok]
    load = meta.get("load_average", {})
    lines.append(
        f"load average (1/5/15 min) {_load(load.get('start'))} at start, "
        f"{_load(load.get('end'))} at end; {meta.get('cpus', '?')} CPUs; "
        f"{meta.get('wall_s', 0):.0f} s wall"
        + (f"; planted: {meta['plant']}" if meta.get("plant") else "")
    )
    lines.append(
        f"speed: CPU budgets are at the speed the workload in benchmarks/guard_speed.py runs in "
        f"{REFERENCE_S:.3f} s; raised by the column's factor where it ran slower"
    )
    lines.append(f"OVER or not measured: {', '.join(over)}" if over else "all figures in budget")
    return "\n".join(lines)


def _load(xs: Sequence[float] | None) -> str:
    return "/".join(f"{x:.2f}" for x in xs) if xs else "?"


def format_json(results: Sequence[Result], meta: dict[str, Any]) -> str:
    doc = {
        **meta,
        "ok": all(r.ok for r in results),
        "results": [
            {
                "figure": r.figure,
                "value": None if r.value is None else round(r.value, 4),
                "unit": r.unit,
                "budget": r.budget,
                "ratio": None if r.ratio is None else round(r.ratio, 4),
                "speed": None if r.speed is None else round(r.speed, 4),
                "status": r.status,
                "raw": [round(x, 4) for x in r.raw],
                "error": r.error,
            }
            for r in results
        ],
    }
    return json.dumps(doc, indent=2)


# -- running the measurements ------------------------------------------------------------------


def measure(
    figures: Sequence[str], budgets: dict[str, Budget], plant: str | None, progress: bool
) -> list[Result]:
    """Measure ``figures`` and judge each against its budget at the machine's speed during its
    measurement (`SpeedSampler`); every child stopped and the temporary directory removed
    whatever happens."""
    measured: dict[str, tuple[float, list[float], float, float]] = {}
    errors: dict[str, str] = {}

    def record(wanted: Sequence[str], get: Callable[[], Values]) -> None:
        t0 = time.monotonic()
        try:
            values = get()
        except MeasureError as exc:
            errors.update({f: str(exc) for f in wanted})
            return
        t1 = time.monotonic()
        for f in wanted:
            value, runs = values[f]
            measured[f] = (value, runs, t0, t1)

    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-guard-"))
    sampler = SpeedSampler()
    try:
        sampler.wait_first()
        ctx = Ctx(tmp, plant, progress=progress)
        try:
            _measure_all(ctx, figures, record)
        finally:
            ctx.close()
    finally:
        sampler.close()
        shutil.rmtree(tmp, ignore_errors=True)
    results: dict[str, Result] = {}
    for f in figures:
        if f in measured:
            value, runs, t0, t1 = measured[f]
            results[f] = judge(f, value, budgets[f], runs, speed=sampler.factor(t0, t1))
        else:  # a measurement failed, or the agent's thread died
            results[f] = judge(f, None, budgets[f], error=errors.get(f, "not measured"))
    return [results[f] for f in figures]


def _measure_all(
    ctx: Ctx, figures: Sequence[str], record: Callable[[Sequence[str], Callable[[], Values]], None]
) -> None:
    background: threading.Thread | None = None
    agent_figures = [f for f in AGENT if f in figures]
    if agent_figures:
        ctx.note(f"measuring {', '.join(agent_figures)} (alongside the CLI figures)")
        agent = start_agent(ctx)  # from this thread: PR_SET_PDEATHSIG follows the thread

        def run_agent() -> None:
            record(agent_figures, lambda: finish_agent(ctx, agent))

        background = threading.Thread(target=run_agent, name="guard-agent", daemon=True)
        background.start()
    for phase in (ALONGSIDE_AGENT, AFTER_AGENT):
        for fn, gives in phase:
            wanted = [f for f in gives if f in figures]
            if wanted:
                ctx.note(f"measuring {', '.join(wanted)}")
                record(wanted, functools.partial(fn, ctx))
        if background is not None:
            background.join()
            background = None


# -- the command -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise GuardError(message)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = _Parser(
        prog="guard.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="measure these figures only")
    ap.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, metavar="FILE")
    ap.add_argument("--plant", choices=PLANTS, help="a planted regression (proves the guard)")
    return ap.parse_args(list(argv))


def _on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit, so the cleanup in ``finally`` blocks runs."""
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        budgets = load_budgets(args.budgets)
        figures = choose_figures(args.only, budgets, args.budgets)
    except GuardError as exc:
        print(f"guard: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    load0 = [round(x, 2) for x in os.getloadavg()]
    try:
        with _signals_raise():
            results = measure(figures, budgets, args.plant, progress=not args.json)
    except KeyboardInterrupt:  # every child stopped, the temporary directory gone
        print("guard: interrupted", file=sys.stderr)
        return 130
    meta = {
        "load_average": {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]},
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - t0, 1),
        "plant": args.plant,
        "speed_reference_s": REFERENCE_S,
    }
    print(format_json(results, meta) if args.json else format_table(results, meta))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
