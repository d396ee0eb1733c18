"""`power sweep --clocks`: the locked-clock half of the sweep command (`gpufleet.cli.power`):
recover clocks a crashed sweep left locked, sweep the clocks, print them and the knob that wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.progress import Progress
from rich.table import Table

from gpufleet.cli.output import console, err_console, fit
from gpufleet.energy.advise import Advice, advise, compare_knobs
from gpufleet.energy.sweep import SweepResult


def plan(backend: Any, gpus: list[int], text: str, state: Path | None, quiet: bool) -> Any:
    """Before anything is swept: reset leftovers of a crashed sweep and check ``text``'s
    clocks against the GPUs' supported ones; (clocks, state file)."""
    from gpufleet.energy import clocks as ck

    path = state or ck.default_clock_state_file()
    recovered = ck.recover_locked_clocks(backend, path)
    if recovered and not quiet:
        err_console.print(f"reset clocks a crashed sweep left locked on GPU(s) {recovered}")
    return ck.parse_clocks(text, ck.supported_clocks(backend, gpus)), path


def clock_sweep(
    backend: Any,
    gpus: list[int],
    planned: tuple[list[int], Path],
    runner: Any,
    seconds: float,
    budget: float,
    quiet: bool,
) -> tuple[SweepResult, Advice | None]:
    """Sweep the planned clocks (always reset after) and advise within ``budget``."""
    from gpufleet.energy import clocks as ck

    wanted, path = planned
    with Progress(console=err_console, transient=True, disable=quiet) as bar:
        task = bar.add_task("sweeping clocks", total=len(wanted))

        def progress(done: int, total: int, mhz: float | None) -> None:
            label = f"{mhz:g} MHz" if mhz is not None and done < total else "done"
            bar.update(task, completed=done, description=label)

        result = ck.sweep_clocks(backend, gpus, wanted, runner, seconds, path, progress=progress)
    return result, advise(result, budget)


def add_to_doc(
    doc: dict[str, Any],
    limit_advice: Advice | None,
    clocks: tuple[SweepResult, Advice | None] | None,
    budget: float,
    modelled: bool,
) -> None:
    """The ``clock_sweep`` and ``knobs`` sections, and the ``modelled`` label."""
    from gpufleet.energy import knobs

    if clocks is not None:
        result, adv = clocks
        doc["clock_sweep"] = knobs.clocks_json(result, adv)
        doc["knobs"] = knobs.comparison_json(compare_knobs(limit_advice, adv), budget)
    doc["modelled"] = modelled
    if modelled:
        doc["model"] = knobs.MODEL_SOURCE


def print_clocks(
    workload: str,
    gpus: list[int],
    limit_advice: Advice | None,
    clocks: tuple[SweepResult, Advice | None],
    budget: float,
    modelled: bool,
) -> None:
    """The clock curve, its recommendation and the comparison of the two knobs."""
    from gpufleet.energy import knobs

    result, adv = clocks
    tag = " (modelled)" if modelled else ""
    table = Table(title=f"locked-clock sweep{tag}: {workload} on GPU(s) {','.join(map(str, gpus))}")
    for col in ("clock MHz", result.unit, "power W", f"{result.unit}/W", "energy"):
        table.add_column(col, justify="right")
    for p in knobs.clock_points_json(result):
        table.add_row(
            str(p["clock_mhz"]),
            f"{p['throughput']:.1f}",
            "N/A" if p["power_w"] is None else f"{p['power_w']:.0f}",
            "N/A" if p["throughput_per_w"] is None else f"{p['throughput_per_w']:.3f}",
            p["energy_method"] or "N/A",
        )
    console.print(fit(table))
    for line in knobs.comparison_lines(compare_knobs(limit_advice, adv), budget, modelled):
        console.print(line)
    if result.restored:
        console.print("locked clocks reset")
