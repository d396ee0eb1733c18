"""MIG packing: an exact planner (integer program solved by HiGHS) and a first-fit baseline.

Exact objective, lexicographic, each stage solved to proven optimality (integer objectives,
absolute gap below 1) with the previous stage's optimum fixed as a constraint:

1. maximise the placed demand, counted in compute slices (``sum_p c_p * placed_p``, ``c_p`` the
   profile's compute slices, ``placed_p <= demanded_p``), so a 7g instance weighs as much as
   seven 1g ones;
2. minimise the GPUs re-partitioned (a GPU whose layout changes must be drained first); on a
   fresh plan every GPU starts with MIG off, so this is the number of GPUs used;
3. (re-planning only) minimise the GPUs used (GPUs with MIG on).

Formulation (a pattern model, after cutting-stock): per model ``m``, integer ``n[m,c]`` = GPUs
re-partitioned to valid layout ``c`` (every layout of ``layouts.layout_space`` made only of
demanded profiles), integer ``k[g]`` = GPUs of current-layout group ``g`` kept as they are;
``sum_c n[m,c] + sum_g k[g] = N_m``; ``placed_p <= sum n[m,c]*count_c(p) + sum k[g]*count_g(p)``.
Instances are then handed to tenants round-robin (max-min fair) per profile.

First-fit baseline: demand in the order given, each instance on the first GPU (fleet order)
where the profile fits at its lowest free valid start slice, limits checked.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.errors import GpufleetError, UnknownNameError
from gpufleet.mig.demand import Demand
from gpufleet.mig.fleet import FleetGpu
from gpufleet.mig.layouts import (
    MAX_MEDIA_EXTENSION_INSTANCES,
    Layout,
    Placement,
    geometry_for,
    layout_space,
)

__all__ = ["Assignment", "GpuResult", "MigPlan", "plan_exact", "plan_first_fit", "plan_mix"]

OBJECTIVE = (
    "lexicographic: (1) maximise placed demand in compute slices; (2) minimise GPUs "
    "re-partitioned (fresh plan: GPUs used); (3) minimise GPUs used"
)


@dataclass(frozen=True)
class Assignment:
    """One GPU instance of a layout and the tenant it serves (``None``: spare)."""

    placement: Placement
    tenant: str | None


@dataclass(frozen=True)
class GpuResult:
    """One GPU's planned layout; ``repartition`` when it differs from today's."""

    gpu: FleetGpu
    layout: Layout
    assignments: tuple[Assignment, ...]
    repartition: bool


@dataclass(frozen=True)
class MigPlan:
    """A MIG plan and its figures."""

    method: str
    objective: str
    gpus: tuple[GpuResult, ...]
    demand: Demand
    placed: dict[str, dict[str, int]]
    unplaced: dict[str, dict[str, int]]
    optimal: bool
    solve_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def placed_instances(self) -> int:
        return sum(sum(d.values()) for d in self.placed.values())

    @property
    def demanded_instances(self) -> int:
        return sum(it.count for it in self.demand.items)

    @property
    def placed_compute_slices(self) -> int:
        return sum(
            a.placement.size and _compute(r.gpu.model, a.placement.profile)
            for r in self.gpus
            for a in r.assignments
            if a.tenant is not None
        )

    @property
    def gpus_used(self) -> int:
        return sum(1 for r in self.gpus if not r.layout.empty)

    @property
    def gpus_repartitioned(self) -> int:
        return sum(1 for r in self.gpus if r.repartition)

    @property
    def memory_slices_stranded(self) -> int:
        return sum(r.layout.memory_stranded for r in self.gpus)

    @property
    def compute_slices_stranded(self) -> int:
        return sum(r.layout.compute_stranded for r in self.gpus)

    @property
    def spare_instances(self) -> int:
        return sum(1 for r in self.gpus for a in r.assignments if a.tenant is None)

    def summary(self) -> dict[str, object]:
        return {
            "method": self.method,
            "objective": self.objective,
            "optimal": self.optimal,
            "demanded_instances": self.demanded_instances,
            "placed_instances": self.placed_instances,
            "placed_compute_slices": self.placed_compute_slices,
            "gpus": len(self.gpus),
            "gpus_used": self.gpus_used,
            "gpus_repartitioned": self.gpus_repartitioned,
            "memory_slices_stranded": self.memory_slices_stranded,
            "compute_slices_stranded": self.compute_slices_stranded,
            "spare_instances": self.spare_instances,
            "solve_s": round(self.solve_s, 4),
        }


def _compute(model: str, profile: str) -> int:
    return geometry_for(model).profile(profile).compute_slices


def _empty(model: str) -> Layout:
    return layout_space(model)[0]


def _check_profiles(gpus: Sequence[FleetGpu], demand: Demand) -> dict[str, int]:
    """Compute-slice weight per demanded profile; did-you-mean when no GPU offers one."""
    models = sorted({g.model for g in gpus})
    offered: dict[str, int] = {}
    for m in models:
        try:
            geo = geometry_for(m)
        except GpufleetError:
            continue
        for p in geo.profiles:
            offered.setdefault(p.name, p.compute_slices)
    for name in demand.totals():
        if name not in offered:
            raise UnknownNameError(f"MIG profile for {', '.join(models)}", name, sorted(offered))
    return {p: offered[p] for p in demand.totals()}


def _media_notes(
    gpus: Sequence[FleetGpu], demand: Demand, unplaced: dict[str, dict[str, int]]
) -> list[str]:
    """Why unplaced ``+me`` demand did not fit, when the one-``+me``-per-GPU limit is the cause:
    more ``+me`` instances asked for than there are GPUs offering one."""
    me_names: set[str] = set()
    offering = 0
    for g in gpus:
        try:
            names = {p.name for p in geometry_for(g.model).profiles if p.media_extensions}
        except GpufleetError:
            continue
        me_names |= names
        offering += bool(names)
    wanted = sum(n for p, n in demand.totals().items() if p in me_names)
    missing: dict[str, int] = {}
    for wants in unplaced.values():
        for p, n in wants.items():
            if p in me_names:
                missing[p] = missing.get(p, 0) + n
    if not missing or wanted <= offering * MAX_MEDIA_EXTENSION_INSTANCES:
        return []
    desc = ", ".join(f"{n}x {p}" for p, n in missing.items())
    return [
        f"{desc} not placed: {wanted} media-extension (+me) instances asked for, but a GPU holds "
        f"at most {MAX_MEDIA_EXTENSION_INSTANCES} (NVIDIA MIG User Guide, Supported MIG "
        f"Profiles) and {offering} GPU(s) here offer one; add GPUs or ask for fewer +me"
    ]


def _fair_share(demand: Demand, placed_total: dict[str, int]) -> dict[str, dict[str, int]]:
    """Split each profile's placed count among its tenants round-robin (max-min fair)."""
    out: dict[str, dict[str, int]] = {t: {} for t in demand.tenants}
    wants = demand.by_tenant()
    for profile, total in placed_total.items():
        left = total
        need = {t: w.get(profile, 0) for t, w in wants.items() if w.get(profile, 0)}
        while left > 0 and any(need.values()):
            for t in list(need):
                if left and need[t]:
                    out[t][profile] = out[t].get(profile, 0) + 1
                    need[t] -= 1
                    left -= 1
    return out


def _unplaced(demand: Demand, placed: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for t, wants in demand.by_tenant().items():
        for p, n in wants.items():
            miss = n - placed.get(t, {}).get(p, 0)
            if miss:
                out.setdefault(t, {})[p] = miss
    return out


def _hand_out(
    layouts: list[tuple[FleetGpu, Layout, bool]], demand: Demand, placed_total: dict[str, int]
) -> tuple[tuple[GpuResult, ...], dict[str, dict[str, int]]]:
    placed = _fair_share(demand, placed_total)
    queue: dict[str, list[str]] = {}
    for t, d in placed.items():
        for p, n in d.items():
            queue.setdefault(p, []).extend([t] * n)
    results = []
    for gpu, layout, changed in layouts:
        assigned = tuple(
            Assignment(pl, queue[pl.profile].pop(0) if queue.get(pl.profile) else None)
            for pl in layout.placements
        )
        results.append(GpuResult(gpu, layout, assigned, changed))
    return tuple(results), {t: d for t, d in placed.items() if d}


_BANNER_DONE = threading.Lock()
_banner_shown = False


def _new_highs() -> Any:
    """A Highs instance; the first one prints a banner on file descriptor 1 (C stdout), which
    would corrupt ``--json`` output, so the first construction runs with fd 1 on /dev/null."""
    global _banner_shown
    import highspy

    with _BANNER_DONE:
        if _banner_shown:
            return highspy.Highs()  # type: ignore[no-untyped-call]
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()  # type: ignore[no-untyped-call]
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _banner_shown = True
        return h


class _Ilp:
    """A small MIP on HiGHS, maximising or minimising one linear objective at a time."""

    def __init__(self, time_limit_s: float) -> None:
        import highspy

        self._hs = highspy
        self.h = _new_highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("time_limit", float(time_limit_s))
        self.h.setOptionValue("mip_rel_gap", 0.0)
        self.h.setOptionValue("mip_abs_gap", 0.99)  # every objective here is integral
        self.n = 0
        self.proved = True

    def var(self, ub: float) -> int:
        self.h.addVar(0.0, float(ub))
        self.h.changeColIntegrality(self.n, self._hs.HighsVarType.kInteger)
        self.n += 1
        return self.n - 1

    def row(self, lo: float, hi: float, coefs: dict[int, float]) -> None:
        idx = np.array(list(coefs), dtype=np.int32)
        val = np.array(list(coefs.values()), dtype=np.float64)
        self.h.addRow(lo, hi, len(idx), idx, val)

    def solve(self, coefs: dict[int, float], maximise: bool) -> tuple[float, list[float]]:
        costs = np.zeros(self.n)
        for i, c in coefs.items():
            costs[i] = c
        self.h.changeColsCost(self.n, np.arange(self.n, dtype=np.int32), costs)
        sense = self._hs.ObjSense.kMaximize if maximise else self._hs.ObjSense.kMinimize
        self.h.changeObjectiveSense(sense)
        self.h.run()
        status = self.h.getModelStatus()
        if status != self._hs.HighsModelStatus.kOptimal:
            self.proved = False
            if self.h.getInfo().primal_solution_status != 2:  # no feasible point
                raise GpufleetError(f"MIG planner: HiGHS stopped with {status} and no solution")
        values = list(self.h.getSolution().col_value)
        return float(sum(c * values[i] for i, c in coefs.items())), values


def _solve(
    gpus: Sequence[FleetGpu], demand: Demand, time_limit_s: float
) -> tuple[list[tuple[FleetGpu, Layout, bool]], dict[str, int], bool]:
    weights = _check_profiles(gpus, demand)
    totals = demand.totals()
    ilp = _Ilp(time_limit_s)
    y = {p: ilp.var(n) for p, n in totals.items()}
    cap: dict[str, dict[int, float]] = {p: {y[p]: 1.0} for p in totals}
    per_model: dict[str, list[FleetGpu]] = {}
    for g in gpus:
        per_model.setdefault(g.model, []).append(g)
    repart: dict[int, tuple[str, Layout]] = {}
    keep: dict[int, tuple[str, tuple[tuple[str, int], ...]]] = {}
    groups: dict[tuple[str, tuple[tuple[str, int], ...]], list[FleetGpu]] = {}
    used_cols: list[int] = []
    for model, members in per_model.items():
        try:
            space = layout_space(model)
        except GpufleetError:
            continue  # no MIG on this model: its GPUs stay whole
        model_row: dict[int, float] = {}
        for lay in space[1:]:
            if not all(p in totals for p in lay.counts):
                continue
            col = ilp.var(len(members))
            repart[col] = (model, lay)
            model_row[col] = 1.0
            used_cols.append(col)
            for p, n in lay.counts.items():
                cap[p][col] = -float(n)
        for g in members:
            cur = g.current or space[0]
            groups.setdefault((model, cur.key), []).append(g)
        for (gm, key), grp in groups.items():
            if gm != model:
                continue
            col = ilp.var(len(grp))
            keep[col] = (gm, key)
            model_row[col] = 1.0
            if key:
                used_cols.append(col)
            for p, n in key:
                if p in cap:
                    cap[p][col] = -float(n)
        ilp.row(len(members), len(members), model_row)
    for p in totals:
        ilp.row(-np.inf, 0.0, cap[p])
    placed_obj = {y[p]: float(weights[p]) for p in totals}
    best, _ = ilp.solve(placed_obj, maximise=True)
    ilp.row(best - 0.5, np.inf, placed_obj)
    changes = {c: 1.0 for c in repart}
    fewest, values = ilp.solve(changes, maximise=False) if changes else (0.0, [0.0] * ilp.n)
    if any(g.current is not None and not g.current.empty for g in gpus) and changes:
        ilp.row(-np.inf, fewest + 0.5, changes)
        _, values = ilp.solve({c: 1.0 for c in used_cols}, maximise=False)
    placed_total = {p: round(values[y[p]]) for p in totals}
    layouts: list[tuple[FleetGpu, Layout, bool]] = []
    pool: dict[str, list[FleetGpu]] = {}
    for col, (model, key) in keep.items():
        grp = groups[(model, key)]
        moved = len(grp) - round(values[col])
        for g in grp[moved:]:
            layouts.append((g, g.current or _empty(model), False))
        pool.setdefault(model, []).extend(grp[:moved])
    for col, (model, lay) in sorted(repart.items(), key=lambda kv: kv[1][1].describe()):
        for _ in range(round(values[col])):
            g = pool[model].pop(0)
            layouts.append((g, lay, True))
    for model, members in per_model.items():
        if model not in {m for m, _ in keep.values()}:
            layouts.extend((g, g.current or Layout(model, ()), False) for g in members)
    order = {(g.node, g.index): i for i, g in enumerate(gpus)}
    layouts.sort(key=lambda t: order[(t[0].node, t[0].index)])
    return layouts, placed_total, ilp.proved


def plan_exact(gpus: Sequence[FleetGpu], demand: Demand, *, time_limit_s: float = 60.0) -> MigPlan:
    """The exact plan (objective in the module doc); re-plans when GPUs carry ``current``."""
    t0 = time.perf_counter()
    layouts, placed_total, optimal = _solve(gpus, demand, time_limit_s)
    results, placed = _hand_out(layouts, demand, placed_total)
    unplaced = _unplaced(demand, placed)
    notes = [] if optimal else ["HiGHS hit its time limit: best plan found, not proved optimal"]
    notes += _media_notes(gpus, demand, unplaced)
    return MigPlan(
        "exact",
        OBJECTIVE,
        results,
        demand,
        placed,
        unplaced,
        optimal,
        time.perf_counter() - t0,
        tuple(notes),
    )


def plan_mix(gpus: Sequence[FleetGpu], mix: Demand, *, time_limit_s: float = 60.0) -> MigPlan:
    """The largest multiple ``k`` of a target mix that the fleet holds whole, planned exactly."""
    weights = _check_profiles(gpus, mix)
    unit = sum(weights[it.profile] * it.count for it in mix.items)
    capacity = 0
    for g in gpus:
        try:
            capacity += geometry_for(g.model).compute_slices
        except GpufleetError:
            continue
    lo, hi = 0, capacity // unit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        _, placed_total, _ = _solve(gpus, mix.scaled(mid), time_limit_s)
        if placed_total == mix.scaled(mid).totals():
            lo = mid
        else:
            hi = mid - 1
    plan = plan_exact(gpus, mix.scaled(max(lo, 1)), time_limit_s=time_limit_s)
    note = f"target mix scaled by k={lo} (the largest multiple placed in full)"
    return MigPlan(
        plan.method,
        plan.objective,
        plan.gpus,
        plan.demand,
        plan.placed,
        plan.unplaced,
        plan.optimal,
        plan.solve_s,
        (*plan.notes, note),
    )


def plan_first_fit(gpus: Sequence[FleetGpu], demand: Demand) -> MigPlan:
    """Baseline: each instance, in demand order, on the first GPU where it fits (MIG off start)."""
    t0 = time.perf_counter()
    _check_profiles(gpus, demand)
    chosen: list[list[Placement]] = [[] for _ in gpus]
    masks = [0] * len(gpus)
    compute = [0] * len(gpus)
    media = [0] * len(gpus)  # media-extension (+me) instances per GPU
    first: dict[str, int] = {}
    geos = {}
    for g in gpus:
        try:
            geos[g.model] = geometry_for(g.model)
        except GpufleetError:
            continue
    placed_total: dict[str, int] = {}

    def try_place(i: int, profile: str) -> bool:
        geo = geos.get(gpus[i].model)
        prof = next((p for p in geo.profiles if p.name == profile), None) if geo else None
        if geo is None or prof is None:
            return False
        if compute[i] + prof.compute_slices > geo.compute_slices:
            return False
        if sum(1 for c in chosen[i] if c.profile == prof.name) >= prof.max_instances:
            return False
        if prof.media_extensions and media[i] >= MAX_MEDIA_EXTENSION_INSTANCES:
            return False
        for start in prof.placements:
            pl = Placement(start, prof.placement_size, prof.name)
            if not pl.mask & masks[i]:
                chosen[i].append(pl)
                masks[i] |= pl.mask
                compute[i] += prof.compute_slices
                media[i] += prof.media_extensions
                return True
        return False

    for item in demand.items:
        for _ in range(item.count):
            # GPUs only fill up, so the first GPU a profile fits on never moves backwards
            i = first.get(item.profile, 0)
            while i < len(gpus) and not try_place(i, item.profile):
                i += 1
            first[item.profile] = i
            if i < len(gpus):
                placed_total[item.profile] = placed_total.get(item.profile, 0) + 1
    layouts = []
    for g, pls, cs in zip(gpus, chosen, compute, strict=True):
        geo = geos.get(g.model)
        lay = Layout(
            g.model,
            tuple(sorted(pls)),
            memory_slices=geo.memory_slices if geo else 8,
            compute_slices=geo.compute_slices if geo else 7,
            compute_used=cs,
        )
        cur = g.current.key if g.current else ()
        layouts.append((g, lay, lay.key != cur))
    results, placed = _hand_out(layouts, demand, placed_total)
    return MigPlan(
        "first-fit",
        "baseline: demand order, first GPU where the instance fits",
        results,
        demand,
        placed,
        _unplaced(demand, placed),
        False,
        time.perf_counter() - t0,
    )
